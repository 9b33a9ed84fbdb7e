"""The workload contract for the external stand-ins in this folder: Megatron flags in, Megatron lines out.

A stand-in is `python tests/workloads/<name>.py <Megatron flags>` with torchrun-style RANK / WORLD_SIZE:
it reads its layout from the flags (VPP from the `--hybrid-layer-pattern` segments, as Megatron does),
evaluates its own synthetic surface, then prints torch's CUDA OOM (exit 1) when the layout does not fit,
else Megatron's iteration lines (rank WORLD_SIZE-1) and, after the first iteration, rank 0's memory line (a
stand-in's one memory figure is its heaviest rank's, the first PP stage's; printed by rank 0, or by the one
process of a local job, which stands for every rank). With
`--fake-process-group` it is a one-GPU rank probe of rank RANK (`probe`), and fails as dev does where the job
gives it no probe mode (orchestrator/plan/probe.refusal). Checkpoints (the warm start,
docs/search.md): `--save DIR` writes Megatron's tracker file after the last iteration; `--load DIR` reads it,
and with `--exit-on-missing-checkpoint` a missing one exits 0 without training, as Megatron does. Every
stand-in prints a [SIMULATED] banner first: its numbers are synthetic.

`Point` is the layout as a stand-in sees it; each stand-in's `evaluate(point) -> (step_s, memory_gb)` is
the same function its job runs, so the search benchmark (tests/bench/bench_search.py) reads the true
surface in-process.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Point:
    """One layout on N GPUs, as the flags give it. recompute: none | full | modules joined by '+';
    dispatcher: alltoall | allgather | flex:<backend>."""

    n: int
    pp: int
    vpp: int
    cp: int
    ep: int
    mbs: int
    gbs: int
    seq: int
    recompute: str
    dispatcher: str
    gpus_per_node: int = 8

    @property
    def d_a(self) -> int:
        """D_a: attention data-parallel size, N / (PP x CP) (TP is 1 in the stand-ins)."""
        return max(1, self.n // (self.pp * self.cp))

    @property
    def d_e(self) -> int:
        """D_e: expert data-parallel size, N / (PP x EP)."""
        return max(1, self.n // (self.pp * self.ep))

    @property
    def m(self) -> int:
        """Microbatches per step per pipeline: B / (b x D_a)."""
        return max(1, self.gbs // (self.mbs * self.d_a))

    @property
    def interleaving(self) -> float:
        """How much more the first PP stage holds with interleaving (VPP > 1): 1 + (PP - 1) / (PP x VPP); 1 without."""
        return 1.0 + (self.pp - 1) / (self.pp * self.vpp) if self.vpp > 1 else 1.0

    def layers_in_flight(self, layers: int) -> float:
        """Layer-microbatches of activations the first PP stage holds under 1F1B: min(PP, m) microbatches of its
        layers / PP, x `interleaving`."""
        return min(self.pp, self.m) * layers / self.pp * self.interleaving


def hbm_gb(variable: str, default: float) -> float:
    """The stand-in's capacity in decimal GB (its OOM message states it in GiB, as torch): its environment
    variable, else its default."""
    return float(os.environ.get(variable, default))


def step_times(step: float, iters: int) -> list[float]:
    """Seconds of iterations 1..iters: the surface's step with a deterministic 1% wobble."""
    return [step * (1.0 + 0.01 * math.sin(it * 1.7)) for it in range(1, iters + 1)]


def point_from_argv(argv: list[str], n: int) -> tuple[Point, int]:
    """(the layout, --train-iters) from Megatron flags."""
    p = argparse.ArgumentParser(add_help=False)
    for name, typ, default in (
        ("pipeline-model-parallel-size", int, 1),
        ("context-parallel-size", int, 1),
        ("expert-model-parallel-size", int, 1),
        ("micro-batch-size", int, 1),
        ("global-batch-size", int, 1),
        ("seq-length", int, 4096),
        ("train-iters", int, 10),
        ("moe-token-dispatcher-type", str, "alltoall"),
        ("moe-flex-dispatcher-backend", str, ""),
        ("hybrid-layer-pattern", str, ""),
    ):
        p.add_argument(f"--{name}", type=typ, default=default)
    p.add_argument("--recompute-modules", nargs="*", default=[])
    p.add_argument("--recompute-granularity", default=None)
    a, _ = p.parse_known_args(argv)
    pp = a.pipeline_model_parallel_size
    segments = a.hybrid_layer_pattern.split("/")[0].count("|") + 1 if a.hybrid_layer_pattern else pp
    recompute = "full" if a.recompute_granularity == "full" else ("+".join(sorted(a.recompute_modules)) or "none")
    disp = a.moe_token_dispatcher_type
    if disp == "flex":
        disp += f":{a.moe_flex_dispatcher_backend}"
    point = Point(
        n=n,
        pp=pp,
        vpp=max(1, segments // pp),
        cp=a.context_parallel_size,
        ep=a.expert_model_parallel_size,
        mbs=a.micro_batch_size,
        gbs=a.global_batch_size,
        seq=a.seq_length,
        recompute=recompute,
        dispatcher=disp,
    )
    return point, a.train_iters


TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's (orchestrator.core.paths.CheckpointPaths.TRACKER)
PROBE_FLAG = "--fake-process-group"
PROBE_UNSEEN_GB = 3.0  # what a stand-in's one-GPU rank probe does not reserve: NCCL and dispatcher buffers
PROBE_COMPUTE_SHARE = 0.7  # of its step: the compute a rank probe runs alone (no all-to-all, no bubble)


def probe(step: float, mem: float) -> tuple[float, float]:
    """A rank probe of the layout (`--fake-process-group`: rank RANK of WORLD_SIZE alone on one GPU, every
    collective skipped): (its compute-only step, what it reserves). A stand-in knows only its heaviest rank,
    so every probed rank shows it, less the buffers a probe cannot see."""
    return step * PROBE_COMPUTE_SHARE, max(0.0, mem - PROBE_UNSEEN_GB)


def main(evaluate: Callable[[Point], tuple[float, float]], banner: str, hbm: float, argv=None) -> int:
    """Run one job of a stand-in: OOM (exit 1) or `--train-iters` Megatron iteration lines. With
    `--fake-process-group` it is a rank probe (`probe`): this rank alone, RANK of WORLD_SIZE."""
    n = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    args = list(sys.argv[1:] if argv is None else argv)
    point, iters = point_from_argv(args, n)
    print(f"[SIMULATED] {banner}", flush=True)
    step, mem = evaluate(point)
    if PROBE_FLAG in args:
        from orchestrator.plan import probe as contract  # what dev refuses at run time (docs/workload.md)

        refused = contract.refusal(args, os.environ.get(contract.MODE_ENV))
        if refused is not None:  # dev builds the model, then its first pipeline receive fails
            print(f"Traceback (most recent call last):\n{refused}", file=sys.stderr, flush=True)
            return 1
        step, mem = probe(step, mem)
    if mem > hbm:
        print(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {rank} has a total "
            f"capacity of {hbm * 1e9 / 2**30:.2f} GiB of which 0 bytes is free.",  # torch states binary GiB
            file=sys.stderr,
            flush=True,
        )
        return 1
    last = rank == n - 1
    speaks = rank == 0 or bool(os.environ.get("ORCH_SINGLE_PROCESS"))  # Megatron's rank 0 (one process: it)
    if "--load" in args:
        tracker = os.path.join(args[args.index("--load") + 1], TRACKER)
        if not os.path.isfile(tracker):
            print(f"WARNING: could not find the metadata file {tracker}", flush=True)
            if "--exit-on-missing-checkpoint" in args:
                print(">> '--exit-on-missing-checkpoint' set ... exiting. <<", flush=True)
                return 0
        elif speaks:
            saved = open(tracker).read().strip()
            print(f" loading distributed checkpoint from {os.path.dirname(tracker)} at iteration {saved}", flush=True)
    for it, seconds in enumerate(step_times(step, iters), start=1):
        time.sleep(0.001)
        if last:
            ts = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
            print(
                f" [{ts}] iteration {it:8d}/{iters:8d} | consumed samples: {it * point.gbs:12d} |"
                f" elapsed time per iteration (ms): {seconds * 1000:.1f} | learning rate: 1.000000E-04 |"
                f" global batch size: {point.gbs:5d} | lm loss: {8.0 / math.sqrt(it):.6E} |"
                f" loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 |"
                f" number of nan iterations:   0 |",
                flush=True,
            )
        if it == 1 and speaks:
            # The one figure a stand-in knows is its heaviest rank's: the first PP stage's DP-rank 0, where 1F1B
            # keeps the most microbatches in flight. So it is that rank's memory line (Megatron prints one per
            # stage, each from the stage's own DP-rank 0), printed by rank 0 or the one process that stands for
            # every rank; printed as the last rank's, it calibrated the planner's last-stage terms on the first
            # stage's peak.
            mb = mem * 1e9 / 2**20
            print(
                f"[Rank 0] (after 1 iterations) memory (MB) | allocated: {mb * 0.8:.2f} | max allocated: "
                f"{mb * 0.95:.2f} | reserved: {mb:.2f} | max reserved: {mb:.2f}",
                flush=True,
            )
    if "--save" in args and speaks:  # after the last iteration, as Megatron's save at --save-interval
        folder = args[args.index("--save") + 1]
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, TRACKER), "w") as fh:
            fh.write(str(iters))
        print(f"  successfully saved checkpoint from iteration {iters:7d} to {folder}", flush=True)
    return 0
