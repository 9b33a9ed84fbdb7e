"""The twin: a GPU-free stand-in for Megatron that speaks its command line and its log format.

`python -m orchestrator.job.twin <megatron flags>` reads the same flags and rank env a real job gets, checks them
against Megatron's assertions (legal), asks the simulated machine (truth: the layout's step time and memory
from its own formulas, not the planner's, on the surface TwinConfig.surface names with hidden constants
drawn from TwinConfig.seed), then behaves like Megatron: an AssertionError for an illegal
layout, torch's CUDA OOM text when the truth memory exceeds HBM, else iteration / memory / timer lines in
Megatron's exact format plus a per-rank sidecar with MoE routing evidence. Everything it prints starts
with the SIMULATED marker and every sidecar says "simulated": true.

Randomness is seeded from (twin.seed, candidate key or argv hash, attempt, rank), so a rerun of the
same attempt prints the same numbers. The lm loss / grad norm curves depend only on (seed, iteration)
plus 1e-4 layout noise, so two layouts agree within the parity tolerance unless TwinConfig.diverge_when
names one of them (the injected numerical bug the correctness gate must catch).

Checkpoints follow Megatron's semantics: --save DIR with --save-interval / --exit-interval saves at those
iterations (timer `save-checkpoint`, the tracker file `latest_checkpointed_iteration.txt`, `iter_0000010/`)
and exits 0 at the exit interval; --load DIR resumes numbering from the saved iteration (timer
`load-checkpoint`). Save / load time = the rank's weights + optimizer state / TwinConfig.ckpt_gb_s.
SIGUSR2 (Slurm's time-limit warning, sent to every process of the step) is ignored: submitit's wrapper
owns it (orchestrator.job.entry also starts every workload with it ignored).

Modules: job (flags + spec -> TwinJob, rank topology, seeded randomness), legal (Megatron's assertions, from
the planner's rule table), truth/ (the simulated machine: shape, machine, surfaces; imports nothing from
orchestrator/plan/), text (Megatron's and torch's exact lines), faults (OOM, assertion, NCCL timeout,
crash), curves (loss / grad norm), checkpoints, sidecars, loop (main, run, train).
"""
