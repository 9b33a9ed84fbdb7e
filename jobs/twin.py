"""The twin: a GPU-free stand-in for Megatron that speaks its command line and its log format.

`python -m jobs.twin <megatron flags>` reads the same flags and rank env a real job gets, evaluates the
layout with the planner's models under HIDDEN truth factors (TwinConfig.truth_*; they differ from the
planner's defaults so calibration has something to learn) and a smooth seed-dependent per-knob
perturbation, then behaves like Megatron: an AssertionError for an illegal layout, torch's CUDA OOM
text when the truth memory exceeds HBM, else iteration / memory / timer lines in Megatron's exact
format plus a per-rank sidecar with MoE routing evidence. Everything it prints starts with the
SIMULATED marker and every sidecar says "simulated": true.

Randomness is seeded from (twin.seed, candidate key or argv hash, attempt, rank), so a rerun of the
same attempt prints the same numbers. The lm loss / grad norm curves depend only on (seed, iteration)
plus 1e-4 layout noise, so two layouts agree within the parity tolerance unless TwinConfig.diverge_when
names one of them (the injected numerical bug the correctness gate must catch).

Checkpoints follow Megatron's semantics: --save DIR with --save-interval / --exit-interval saves at those
iterations (timer `save-checkpoint`, the tracker file `latest_checkpointed_iteration.txt`, `iter_0000010/`)
and exits 0 at the exit interval; --load DIR resumes numbering from the saved iteration (timer
`load-checkpoint`). Save / load time = the rank's weights + optimizer state / TwinConfig.ckpt_gb_s.
SIGUSR2 (Slurm's time-limit warning, sent to every process of the step) is ignored: submitit's wrapper
owns it (jobs.entry also starts every workload with it ignored).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from pathlib import Path

from orchestrator.plan import argv as plan_argv
from orchestrator.plan import memory as plan_memory
from orchestrator.plan import pipeline, planner
from orchestrator.plan.layout import Layout, Prediction, groups
from orchestrator.plan.ranks import order_for
from orchestrator.schema import HardwareConfig, ModelConfig, StageConfig, TwinConfig

MEGATRON = "/opt/megatron-lm"  # the paths the tracebacks name: where the real entry script lives
NCCL_GROUPS = {  # Megatron's process-group descriptions, as torch's watchdog prints them
    "ep": "EXPERT_MODEL_PARALLEL_GROUP",
    "dp": "DATA_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
    "cp": "CONTEXT_PARALLEL_GROUP",
}
LB_LOSS_KEYS = {
    "aux_loss": "load_balancing_loss",
    "seq_aux_loss": "seq_load_balancing_loss",
    "global_aux_loss": "global_load_balancing_loss",
}
MIB = 1024 * 1024
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
IGNORED_SIGNALS = (signal.SIGUSR2,)  # Slurm's --signal warning: submitit's wrapper owns it, never the workload
TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's checkpoint tracker file
CKPT_MARKER = "twin-checkpoint.json"  # what the twin "saves" in iter_NNNNNNN/ (simulated)


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# ----------------------------------------------------------------------------------------------- setup
@dataclass
class TwinJob:
    """Everything the twin knows about the job it pretends to be."""

    flags: dict[str, object]
    layout: Layout
    model: ModelConfig
    stage: StageConfig
    hw: HardwareConfig
    twin: TwinConfig
    rank: int
    world: int
    single_process: bool
    job_dir: Path | None
    key: str
    attempt: int
    train_iters: int
    log_interval: int
    model_flops: float = 0.0  # per step; 0 = take the planner's
    entry: str = f"{MEGATRON}/pretrain_hybrid.py"


def _flag(flags: dict[str, object], name: str, default=None):
    """A parsed flag by argparse dest (`moe_router_topk`); absent or None -> default."""
    value = flags.get(name)
    return default if value is None else value


def _from_flags(cls, base, flags: dict[str, object]):
    """Override dataclass fields whose Megatron flag is present (`--num-experts` -> num_experts)."""
    updates = {}
    for f in fields(cls):
        v = _flag(flags, f.name)
        cur = getattr(base, f.name)
        if v is None or isinstance(cur, (list, dict)) or (cur is not None and not isinstance(cur, (int, float, str))):
            continue
        try:
            updates[f.name] = type(cur)(v) if cur is not None and not isinstance(cur, bool) else v
        except (TypeError, ValueError):
            continue
    return replace(base, **updates)


def _model_from_flags(flags: dict[str, object]) -> ModelConfig:
    """Without a spec: the model from the flags. --num-layers is the pattern's symbol count (2 per block),
    so the block count comes from the hybrid pattern."""
    model = _from_flags(ModelConfig, ModelConfig(), flags)
    pattern = _flag(flags, "hybrid_layer_pattern")
    if pattern:
        model = replace(model, num_layers=sum(pipeline.count_blocks(str(pattern))))
    return model


def load_job(argv: Sequence[str], environ=os.environ) -> TwinJob:
    """Flags first (what Megatron would see), then ORCH_JOB_SPEC for hardware, twin knobs and the key."""
    flags = plan_argv.parse_flags(list(argv))
    layout = plan_argv.layout_from_argv(list(argv))
    spec = None
    spec_path = environ.get("ORCH_JOB_SPEC")
    if spec_path and Path(spec_path).exists():
        from jobs.spec import JobSpec

        spec = JobSpec.load(spec_path)
    model = spec.model if spec else _model_from_flags(flags)
    stage = spec.stage if spec else StageConfig()
    hw = spec.hardware if spec else HardwareConfig()
    twin = spec.workload.twin if spec else TwinConfig()
    world = int(environ.get("WORLD_SIZE") or (spec.n_gpus if spec else stage.gpus))
    gbs = _flag(flags, "global_batch_size")
    seq = _flag(flags, "seq_length")
    stage = replace(
        stage,
        gpus=world,
        global_batch=int(gbs) if gbs else stage.global_batch,
        seq_length=int(seq) if seq else stage.seq_length,
    )
    rank = int(environ.get("RANK", world - 1))
    key = spec.candidate_key if spec else hashlib.sha256(" ".join(argv).encode()).hexdigest()[:16]
    job_dir = environ.get("ORCH_JOB_DIR") or (spec.job_dir if spec else None)
    return TwinJob(
        flags=flags,
        layout=layout,
        model=model,
        stage=stage,
        hw=hw,
        twin=twin,
        rank=rank,
        world=world,
        single_process=environ.get("ORCH_SINGLE_PROCESS") == "1",
        job_dir=Path(job_dir) if job_dir else None,
        key=key,
        attempt=spec.attempt if spec else 0,
        train_iters=int(_flag(flags, "train_iters") or stage.warmup_iters + stage.measure_iters),
        log_interval=max(1, int(_flag(flags, "log_interval") or 1)),
        model_flops=spec.model_flops_per_step if spec else 0.0,
    )


def rng_for(job: TwinJob, *salt) -> random.Random:
    blob = json.dumps([job.twin.seed, job.key, job.attempt, *salt])
    return random.Random(int(hashlib.sha256(blob.encode()).hexdigest()[:16], 16))


def job_rng(job: TwinJob, *salt) -> random.Random:
    """Same for every rank of an attempt: faults and step times must agree across ranks."""
    return rng_for(job, "job", *salt)


# ------------------------------------------------------------------------------------------- truth
def perturbation(layout: Layout, seed: int, amplitude: float = 0.06) -> float:
    """A smooth, seed-dependent multiplier per knob, so the truth is not the model times a constant.

    Numeric knobs vary as a sine of log2(value) (neighbours differ a little, far values more);
    categorical knobs (dispatcher, recompute, offload) get a fixed seeded offset each.
    """
    r = random.Random(f"twin-surface-{seed}")
    log_mult = 0.0
    for knob in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs"):
        a, w, ph = r.uniform(0.3, 1.0), r.uniform(0.6, 1.4), r.uniform(0, 2 * math.pi)
        log_mult += amplitude * a * math.sin(w * math.log2(max(1, getattr(layout, knob))) + ph) / 3
    for label in (layout.dispatcher_label, "+".join(layout.recompute), "+".join(layout.offload)):
        h = int(hashlib.sha256(f"{seed}:{label}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        log_mult += amplitude * (h - 0.5) / 2
    return math.exp(log_mult)


def truth(job: TwinJob, hbm_gb: float | None = None):
    """planner.evaluate under the hidden truth factors, with no memory margin (OOM means > HBM)."""
    hw = job.hw if hbm_gb is None else replace(job.hw, hbm_gb=hbm_gb)
    stage = replace(job.stage, memory_margin_gb=0.0)
    return planner.evaluate(
        job.model, hw, stage, job.layout, factors=planner_factors(job.twin), memory_factor=job.twin.truth_memory
    )


def planner_factors(twin: TwinConfig) -> dict[str, float]:
    """The truth multipliers, keyed by the step-time model's COMPONENTS."""
    return {"compute": twin.truth_compute, "a2a": twin.truth_a2a, "bubble": twin.truth_bubble}


def memory_rejected(rejected) -> bool:
    """Rejected only by the memory phase: the layout is legal, it just does not fit."""
    return all(getattr(r, "phase", "") == "memory" for r in rejected.rules)


# ------------------------------------------------------------------------------------- rank topology
def coords(job: TwinJob, rank: int) -> dict[str, int]:
    """The dense-grid coordinates of a rank (tp, cp, dp, pp) in Megatron's rank order."""
    lay = job.layout
    d_a = max(1, job.world // (lay.tp * lay.cp * lay.pp))
    sizes = {"tp": lay.tp, "cp": lay.cp, "ep": 1, "dp": d_a, "pp": lay.pp}
    out, rest = {}, rank
    for axis in order_for(lay).split("-"):
        out[axis] = rest % sizes[axis]
        rest //= sizes[axis]
    return out


def dp0_ranks(job: TwinJob) -> list[int]:
    """Ranks with DP-rank 0: one per TP x CP x PP position (they print Megatron's memory lines)."""
    return [r for r in range(job.world) if coords(job, r)["dp"] == 0]


def reported_ranks(job: TwinJob) -> list[int]:
    """The ranks this process speaks for: itself, or every DP-rank-0 rank in single-process mode."""
    return dp0_ranks(job) if job.single_process else [job.rank]


# ------------------------------------------------------------------------------------------ formats
def stamp() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")


def iteration_line(
    it: int,
    train_iters: int,
    consumed: int,
    elapsed_ms: float,
    tflops: float,
    lr: float,
    gbs: int,
    losses: Sequence[tuple[str, float]],
    grad_norm: float,
) -> str:
    """Megatron's training_log line (TR:3539-3656) with --log-throughput, bf16 (loss scale 1.0)."""
    s = f" [{stamp()}] iteration {it:8d}/{train_iters:8d} | consumed samples: {consumed:12d} |"
    s += f" elapsed time per iteration (ms): {elapsed_ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += f" learning rate: {lr:.6E} | global batch size: {gbs:5d} |"
    for k, v in losses:
        s += f" {k}: {v:.6E} |"
    s += f" loss scale: {1.0:.1f} | grad norm: {grad_norm:.3f} |"
    s += f" number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |"
    return s


def memory_line(rank: int, it: int, alloc: float, max_alloc: float, reserved: float, max_reserved: float) -> str:
    return (
        f"[Rank {rank}] (after {it} iterations) memory (MB) | allocated: {alloc:.2f} | max allocated: "
        f"{max_alloc:.2f} | reserved: {reserved:.2f} | max reserved: {max_reserved:.2f}"
    )


def timers_block(rows: Sequence[tuple[str, float, float]]) -> str:
    """core/timers.py minmax format, as logger.info prints it with Python's default formatter."""
    lines = ["INFO:megatron.core.timers:(min, max) time across ranks (ms):"]
    for name, lo, hi in rows:
        lines.append("    " + (name + " ").ljust(48, ".") + f": ({lo:.2f}, {hi:.2f})")
    return "\n".join(lines)


def format_size(nbytes: float) -> str:
    """c10's format_size: bytes, KiB, MiB or GiB with two decimals."""
    if nbytes <= 1024:
        return f"{int(nbytes)} bytes"
    for unit, scale in (("KiB", 1024), ("MiB", MIB), ("GiB", 1024**3)):
        if nbytes <= scale * 1024 or unit == "GiB":
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.2f}"


def megatron_message(job: TwinJob, rule) -> str:
    """The assertion text Megatron prints for the first violated rule (with the numbers), else the
    rule's own one-line reason and id."""
    lay, m, st = job.layout, job.model, job.stage
    g = groups(lay, job.world, st.global_batch)
    known = {
        "mcore.experts_div_ep": f"number of experts ({m.num_experts}) must be divisible by expert model "
        f"parallel size ({lay.ep})",
        "mcore.dense_grid": f"world size ({job.world}) is not divisible by total_model_size "
        f"({lay.tp * lay.pp * lay.cp})",
        "mcore.expert_grid": f"world size ({job.world}) is not divisible by expert_tensor_model_pipeline_parallel "
        f"size ({lay.etp * lay.ep * lay.pp})",
        "mcore.gbs_div_mbs_dp": f"global batch size ({st.global_batch}) is not divisible by micro batch size "
        f"({lay.mbs}) times data parallel size ({g.d_a})",
        "mcore.seq_div_2cp": f"seq-length ({st.seq_length}) should be divisible by 2 * context-parallel-size "
        f"({lay.cp})",
        "mcore.heads_div_tp": f"num_attention_heads ({m.num_attention_heads}) must be a multiple of "
        f"tensor_model_parallel_size ({lay.tp}).",
    }
    return known.get(rule.id, f"{rule.reason} [{rule.id}]")


def _frames(*frames: tuple[str, int, str, str]) -> str:
    out = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        out.append(f'  File "{path}", line {line}, in {func}')
        out.append(f"    {code}")
    return "\n".join(out)


def assertion_traceback(entry: str, reason: str) -> str:
    head = _frames(
        (entry, 220, "<module>", "pretrain("),
        (f"{MEGATRON}/megatron/training/training.py", 668, "pretrain", "initialize_megatron("),
        (
            f"{MEGATRON}/megatron/training/initialize.py",
            92,
            "initialize_megatron",
            "validate_args(args, args_defaults)",
        ),
        (f"{MEGATRON}/megatron/training/arguments.py", 446, "validate_args", "assert cond, ("),
    )
    return f"{head}\nAssertionError: {reason}"


def oom_traceback(entry: str, want_gb: float, hbm_gb: float, rank: int) -> str:
    """torch's CUDACachingAllocator message, raised from the backward pass of the first iteration."""
    total = hbm_gb * 1e9 * 0.989  # what the driver reports as total capacity
    in_use = total - 0.02 * 1e9
    allocated = min(in_use * 0.96, want_gb * 1e9)
    ask = max(64 * MIB, (want_gb - hbm_gb) * 1e9 + 256 * MIB)
    head = _frames(
        (entry, 220, "<module>", "pretrain("),
        (
            f"{MEGATRON}/megatron/training/training.py",
            752,
            "pretrain",
            "iteration, num_floating_point_operations_so_far = train(",
        ),
        (f"{MEGATRON}/megatron/training/training.py", 2310, "train", "train_step(forward_step_func,"),
        (
            f"{MEGATRON}/megatron/core/pipeline_parallel/schedules.py",
            469,
            "backward_step",
            "custom_backward(output_tensor[0], output_tensor_grad[0])",
        ),
        (
            "/usr/local/lib/python3.12/dist-packages/torch/autograd/graph.py",
            829,
            "_engine_run_backward",
            "return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass",
        ),
    )
    msg = (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {format_size(ask)}. GPU {rank % 8} "
        f"has a total capacity of {format_size(total)} of which {format_size(total - in_use)} is free. "
        f"Including non-PyTorch memory, this process has {format_size(in_use)} memory in use. Of the allocated "
        f"memory {format_size(allocated)} is allocated by PyTorch, and {format_size(in_use - allocated)} is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    return f"{head}\n{msg}"


def nccl_watchdog_line(rank: int, group: str, seq: int, op: str = "ALLTOALL_BASE", timeout_ms: int = 600000) -> str:
    now = datetime.now()
    ts = now.strftime("%m%d %H:%M:%S.") + f"{now.microsecond:06d}000"
    pg = {
        "EXPERT_MODEL_PARALLEL_GROUP": 7,
        "DATA_PARALLEL_GROUP": 3,
        "PIPELINE_MODEL_PARALLEL_GROUP": 5,
        "CONTEXT_PARALLEL_GROUP": 4,
    }.get(group, 1)
    return (
        f"[rank{rank}]:[E{ts} ProcessGroupNCCL.cpp:632] [PG ID {pg} PG GUID {pg}({group}) Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=4194304, "
        f"NumelOut=4194304, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 13} milliseconds before timing out."
    )


def crash_traceback(entry: str) -> str:
    head = _frames(
        (entry, 220, "<module>", "pretrain("),
        (
            f"{MEGATRON}/megatron/training/training.py",
            752,
            "pretrain",
            "iteration, num_floating_point_operations_so_far = train(",
        ),
        (
            f"{MEGATRON}/megatron/core/transformer/moe/token_dispatcher.py",
            1012,
            "token_permutation",
            "global_input_tokens = all_to_all(",
        ),
    )
    return (
        f"{head}\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    )


# ------------------------------------------------------------------------------------------ numbers
def step_times(job: TwinJob, pred: Prediction, n: int | None = None, start: int = 0) -> list[float]:
    """Per-iteration seconds for the `n` iterations this process runs: truth x perturbation x lognormal
    noise, x tail_factor with tail_prob, and a warm-up effect that fades over the first iterations after
    the process starts (compile, NCCL setup, allocator), after a restart too."""
    t = job.twin
    base = pred.step_time_s * perturbation(job.layout, t.seed)
    rng = job_rng(job, "steps") if not start else job_rng(job, "steps", start)  # a restored run draws anew
    out = []
    for i in range(job.train_iters if n is None else n):
        s = base * math.exp(rng.gauss(0.0, t.noise_sigma)) * (1.0 + 2.0 * math.exp(-i / 1.0))
        if rng.random() < t.tail_prob:
            s *= t.tail_factor
        out.append(s)
    return out


LAYOUT_NOISE = 1e-4  # relative, per layout and iteration: the packed path is not bit-deterministic
DIVERGE_TAU = 10.0  # iterations over which an injected divergence grows to its full scale


def diverges(layout: Layout, when: dict[str, int]) -> bool:
    """True when every knob named in `when` has that value in `layout` (an empty `when` never matches)."""
    return bool(when) and all(getattr(layout, k, None) == v for k, v in when.items())


def drift(it: int, scale: float) -> float:
    """Relative error of a diverging layout at iteration `it`: 0 at the start, growing towards `scale`."""
    return scale * (1.0 - math.exp(-it / DIVERGE_TAU))


def _layout_noise(tag: str, it: int, what: str) -> float:
    h = int(hashlib.sha256(f"{what}:{tag}:{it}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return LAYOUT_NOISE * (h - 0.5)


def loss_curve(
    seed: int, it: int, *, vocab_size: int, layout_tag: str = "", drift_scale: float = 0.0
) -> tuple[float, float]:
    """(lm loss, grad norm) at iteration `it`: a decreasing curve fixed by (seed, it), the same for every
    layout up to LAYOUT_NOISE, times (1 + drift) for a diverging layout (grad norm drifts twice as much)."""
    start = math.log(max(2, vocab_size))
    floor = 2.2
    shared = random.Random(f"twin-loss-{seed}-{it}").gauss(0, 0.01)
    loss = (floor + (start - floor) * math.exp(-it / 60.0) + shared) * (1.0 + _layout_noise(layout_tag, it, "loss"))
    gn = (0.8 + 6.0 * math.exp(-it / 25.0) + random.Random(f"twin-gn-{seed}-{it}").gauss(0, 0.02)) * (
        1.0 + _layout_noise(layout_tag, it, "gn")
    )
    d = drift(it, drift_scale)
    return loss * (1.0 + d), gn * (1.0 + 2.0 * d)


def _curve(job: TwinJob, it: int) -> tuple[float, float]:
    scale = job.twin.diverge_scale if diverges(job.layout, job.twin.diverge_when) else 0.0
    return loss_curve(
        job.twin.seed, it, vocab_size=job.model.vocab_size, layout_tag=job.layout.short(), drift_scale=scale
    )


def lm_loss(job: TwinJob, it: int) -> float:
    return _curve(job, it)[0]


def grad_norm(job: TwinJob, it: int) -> float:
    return _curve(job, it)[1]


def stage_memory(job: TwinJob, pred: Prediction, stage_idx: int, rank: int) -> tuple[float, float, float, float]:
    """(allocated, max allocated, reserved, max reserved) MB for one rank: max reserved is the truth
    memory of its pipeline stage, with a small per-rank spread across TP/CP positions."""
    by_stage = pred.memory_by_stage or (pred.memory_gb,)
    gb = by_stage[min(stage_idx, len(by_stage) - 1)]
    jitter = 1.0 + 0.004 * (random.Random(f"{job.key}-{rank}").random() - 0.5)
    max_reserved = gb * 1e9 / MIB * jitter
    max_alloc = max_reserved * 0.93
    return max_alloc * 0.55, max_alloc, max_reserved * 0.97, max_reserved


def timer_rows(pred: Prediction, step_s: float, rng: random.Random) -> list[tuple[str, float, float]]:
    """Megatron's level-1 timers, (min, max) across ranks in ms, from the step's components."""
    comp = pred.step_components or {}
    total = sum(comp.values()) or 1.0
    ms = step_s * 1000.0
    opt = ms * comp.get("optimizer", 0.03 * total) / total
    sync = ms * comp.get("grad_sync", 0.0) / total
    fb = ms - opt - sync
    spread = 0.04 + 0.04 * rng.random()  # the fastest rank waits at the pipeline flush
    return [
        ("forward-backward", fb * (1 - spread), fb),
        ("all-grads-sync", sync * 0.9, sync),
        ("params-all-gather", sync * 0.2, sync * 0.25),
        ("optimizer-copy-to-main-grad", opt * 0.05, opt * 0.06),
        ("optimizer-inner-step", opt * 0.7, opt * 0.75),
        ("optimizer-copy-main-to-model-params", opt * 0.1, opt * 0.12),
        ("optimizer", opt * 0.95, opt),
    ]


def moe_layers_on_stage(pattern: str, pp: int, stage: int) -> int:
    """MoE layers ('E') of one PP rank in the hybrid pattern: segment i runs on PP rank i % PP;
    the MTP depths (after '/') run on the last rank."""
    main, *mtp = pattern.split("/")
    count = sum(seg.count("E") for seg in main.split("|")[stage::pp])
    return count + (sum(d.count("E") for d in mtp) if stage == pp - 1 else 0)


def routing(job: TwinJob, pred: Prediction, rank: int, iters: int) -> dict:
    """Per-expert token counts as the router on `rank` sees them over `iters` measured iterations,
    with lognormal expert popularity (routing_skew) and capacity-factor drops/padding."""
    m, lay = job.model, job.layout
    e, k = max(1, m.num_experts), m.moe_router_topk
    pop_rng = job_rng(job, "popularity")  # expert popularity is a property of the model, not the rank
    w = [math.exp(pop_rng.gauss(0.0, job.twin.routing_skew)) for _ in range(e)]
    total_w = sum(w)
    g = groups(lay, job.world, job.stage.global_batch)
    mb_tokens = lay.mbs * job.stage.seq_length // max(1, lay.cp)  # per microbatch on this rank
    micro = (g.m or 1) * iters
    layers = max(1, moe_layers_on_stage(pred.layer_pattern, lay.pp, coords(job, rank)["pp"]))
    rng = rng_for(job, "routing", rank)
    counts, routed, dropped, padded = [0] * e, 0, 0, 0
    pad = bool(_flag(job.flags, "moe_pad_expert_input_to_capacity", False))
    cap = math.ceil(lay.capacity_factor * mb_tokens * k / e) if lay.capacity_factor else None
    for i in range(e):
        mean = mb_tokens * k * w[i] / total_w
        c = max(0, round(rng.gauss(mean, math.sqrt(mean))))  # one microbatch-layer sample
        kept = min(c, cap) if cap is not None else c
        counts[i] = kept * micro * layers
        routed += c * micro * layers
        if cap is not None:
            dropped += (c - kept) * micro * layers
            if pad:
                padded += (cap - kept) * micro * layers
    return {
        "tokens_per_expert": counts,
        "dropped_tokens": dropped,
        "padded_tokens": padded,
        "routed_tokens": routed,
        "moe_layers": layers,
        "microbatches": micro,
    }


# ---------------------------------------------------------------------------------------------- run
def out(line: str) -> None:
    print(line, flush=True)


def err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _on_signal(signum, frame):
    for sig in STOP_SIGNALS:  # Slurm signals every process and the task forwards: act on the first only
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    from jobs.parse import SIMULATED_MARKER

    argv = list(sys.argv[1:] if argv is None else argv)
    out(f"{SIMULATED_MARKER} twin workload: numbers are simulated")
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    try:
        job = load_job(argv)
        return run(job)
    except Interrupted as exc:
        err(f"[twin] received signal {signal.Signals(exc.signum).name}; exiting without finishing training")
        return 128 + exc.signum


def run(job: TwinJob) -> int:
    out(f"[after megatron is initialized] datetime: {stamp()[:-7]} ")
    result = truth(job)
    if isinstance(result, planner.Rejected):
        if not memory_rejected(result):
            err(assertion_traceback(job.entry, megatron_message(job, result.rules[0])))
            return 1
        # Legal, but over HBM under the truth: predict it on unbounded HBM to know each stage's memory.
        result = truth(job, hbm_gb=math.inf)
    pred = result.prediction
    over = [s for s in range(job.layout.pp) if _stage_gb(pred, s) > job.hw.hbm_gb]
    if over or job.twin.force_oom:
        # The whole job dies; ranks of an over-HBM stage print torch's OOM (every rank when forced).
        mine = [r for r in reported_ranks(job) if job.twin.force_oom or coords(job, r)["pp"] in over]
        if mine:
            want = _stage_gb(pred, coords(job, mine[0])["pp"])
            err(oom_traceback(job.entry, max(want, job.hw.hbm_gb * 1.01), job.hw.hbm_gb, mine[0]))
        return 1
    out(f"[before the start of training step] datetime: {stamp()[:-7]} ")
    return train(job, pred)


def _stage_gb(pred: Prediction, stage_idx: int) -> float:
    by_stage = pred.memory_by_stage or (pred.memory_gb,)
    return by_stage[min(stage_idx, len(by_stage) - 1)]


def train(job: TwinJob, pred: Prediction) -> int:
    t = job.twin
    ck = Checkpointing.of(job)
    start = 0
    if ck.load_dir:
        try:
            start = load_checkpoint(job, pred, ck)
        except LoadFailed as exc:
            return exc.code
    times = step_times(job, pred, max(0, job.train_iters - start), start)
    fault_rng = job_rng(job, "faults")
    lo = min(job.train_iters, max(start + 1, job.stage.warmup_iters + 1))
    nccl_at = fault_rng.randint(lo, job.train_iters) if fault_rng.random() < t.nccl_timeout_rate else None
    crash_at = fault_rng.randint(lo, job.train_iters) if fault_rng.random() < t.crash_rate else None
    group = _nccl_group(job, fault_rng)
    last = job.rank == job.world - 1
    flops = job.model_flops or pred.flops_per_step
    lr = float(_flag(job.flags, "lr", 1e-4) or 1e-4)
    lb_key = LB_LOSS_KEYS.get(str(_flag(job.flags, "moe_router_load_balancing_type", "aux_loss")))
    mtp = int(_flag(job.flags, "mtp_num_layers", job.model.mtp_num_layers) or 0)
    timer_rng = job_rng(job, "timers")
    window: list[float] = []
    measured = 0
    for it in range(start + 1, job.train_iters + 1):
        step = times[it - start - 1]
        time.sleep(min(step * t.time_scale, t.max_sleep_s))
        if it == nccl_at:
            for r in reported_ranks(job):
                err(nccl_watchdog_line(r, group, seq=1000 + it * 97))
            return 1
        if it == crash_at:
            err(crash_traceback(job.entry))
            return 1
        window.append(step)
        if it > job.stage.warmup_iters:
            measured += 1
        if it % job.log_interval and it != start + 1:
            continue
        avg = sum(window) / len(window)
        window = []
        if last:
            loss, gn = _curve(job, it)
            losses = [("lm loss", loss)]
            if lb_key:
                losses.append((lb_key, 1.0 + 0.5 * t.routing_skew**2 * (1 + math.exp(-it / 30.0))))
            losses += [(f"mtp_{i + 1} loss", loss + 0.3) for i in range(mtp)]
            tflops = flops / (avg * 1e12 * job.world)
            out(
                iteration_line(
                    it,
                    job.train_iters,
                    it * job.stage.global_batch,
                    avg * 1000.0,
                    tflops,
                    lr,
                    job.stage.global_batch,
                    losses,
                    gn,
                )
            )
        if it == start + 1:
            for r in reported_ranks(job):
                if coords(job, r)["dp"] == 0:
                    out(memory_line(r, it, *stage_memory(job, pred, coords(job, r)["pp"], r)))
        if last:
            err(timers_block(timer_rows(pred, avg, timer_rng)))
        exiting = ck.exit_interval and it % ck.exit_interval == 0
        if ck.save_dir and ((ck.save_interval and it % ck.save_interval == 0) or exiting):
            save_checkpoint(job, pred, ck, it)
        if exiting:
            write_sidecars(job, pred, measured)
            out(f"[exiting program at iteration {it}] datetime: {stamp()[:-7]} ")
            return 0
    write_sidecars(job, pred, measured)
    out(f"[after training is done] datetime: {stamp()[:-7]} ")
    return 0


# ----------------------------------------------------------------------------------------- checkpoints
@dataclass
class Checkpointing:
    """Megatron's checkpoint flags, as the twin reads them."""

    save_dir: Path | None
    load_dir: Path | None
    save_interval: int
    exit_interval: int
    exit_on_missing: bool

    @classmethod
    def of(cls, job: TwinJob) -> Checkpointing:
        f = job.flags

        def path(name):
            v = _flag(f, name)
            return Path(str(v)) if v not in (None, True) else None

        return cls(
            save_dir=path("save"),
            load_dir=path("load"),
            save_interval=int(_flag(f, "save_interval", 0) or 0),
            exit_interval=int(_flag(f, "exit_interval", 0) or 0),
            exit_on_missing=bool(_flag(f, "exit_on_missing_checkpoint", False)),
        )


def checkpoint_gb(job: TwinJob, pred: Prediction) -> list[float]:
    """Per PP stage: the GB one rank writes (its weights + optimizer state, the memory model's parts)."""
    lay = job.layout
    mems = plan_memory.stage_memory(
        job.model,
        job.hw,
        job.stage,
        lay,
        groups(lay, job.world, job.stage.global_batch),
        pipeline.count_blocks(pred.layer_pattern),
    )
    return [m.weights + m.optimizer for m in mems]


def checkpoint_ms(job: TwinJob, pred: Prediction, what: str, factor: float = 1.0) -> tuple[float, float]:
    """(min, max) ms across ranks to write (or read, factor > 1) each rank's share at ckpt_gb_s."""
    rng = job_rng(job, "ckpt", what)
    times = [
        gb / max(job.twin.ckpt_gb_s, 1e-9) * factor * math.exp(rng.gauss(0.0, job.twin.noise_sigma)) * 1000.0
        for gb in checkpoint_gb(job, pred)
    ]
    return min(times), max(times)


def _speaks_rank0(job: TwinJob) -> bool:
    return job.rank == 0 or job.single_process


def save_checkpoint(job: TwinJob, pred: Prediction, ck: Checkpointing, it: int) -> None:
    """Megatron's save_checkpoint_and_time: the lines rank 0 prints, the `save-checkpoint` timer (log level 0)
    on the last rank, the tracker file and a marker standing for the checkpoint's shards."""
    lo, hi = checkpoint_ms(job, pred, f"save-{it}")
    time.sleep(min(hi / 1000.0 * job.twin.time_scale, 0.05))
    save = ck.save_dir
    if _speaks_rank0(job):
        out(f"[{stamp()}] saving checkpoint at iteration {it:7d} to {save} in torch_dist format")
        folder = save / f"iter_{it:07d}"
        folder.mkdir(parents=True, exist_ok=True)
        marker = {
            "simulated": True,
            "iteration": it,
            "key": job.key,
            "layout": job.layout.short(),
            "consumed_samples": it * job.stage.global_batch,
            "save_ms": [lo, hi],
        }
        _atomic_write(folder / CKPT_MARKER, json.dumps(marker))
        _atomic_write(save / TRACKER, str(it))
        out(
            f"  [{stamp()}] successfully saved checkpoint from iteration {it:7d} to {save} "
            f"[ t 1/{job.layout.tp}, gtp_remat 1/1, p 1/{job.layout.pp} ]"
        )  # rank 0's own coordinates
    if job.rank == job.world - 1:
        err(timers_block([("save-checkpoint", lo, hi)]))


class LoadFailed(Exception):
    """Nothing was loaded; `code` is the process exit status Megatron ends with."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def load_checkpoint(job: TwinJob, pred: Prediction, ck: Checkpointing) -> int:
    """The iteration to resume from (0: none found, start from random), after the lines Megatron prints.

    No tracker file: Megatron warns and starts from random; with --exit-on-missing-checkpoint it exits
    (sys.exit(), status 0: LoadFailed(0)). A tracker naming an iteration whose files are gone: the load
    raises FileNotFoundError (LoadFailed(1))."""
    load = ck.load_dir
    tracker = load / TRACKER
    if not tracker.is_file():
        if _speaks_rank0(job):
            out(f"WARNING: could not find the metadata file {tracker}")
            out("    will not load any checkpoints and will start from random")
        if ck.exit_on_missing:
            out(">> '--exit-on-missing-checkpoint' set ... exiting. <<")
            raise LoadFailed(0)
        return 0
    it = int(tracker.read_text().strip())
    marker = load / f"iter_{it:07d}" / CKPT_MARKER
    if _speaks_rank0(job):
        out(f" loading distributed checkpoint from {load} at iteration {it}")
    if not marker.is_file():
        err(
            _frames(
                (job.entry, 220, "<module>", "pretrain("),
                (
                    f"{MEGATRON}/megatron/training/training.py",
                    2199,
                    "setup_model_and_optimizer",
                    "args.iteration, args.num_floating_point_operations_so_far = load_checkpoint(",
                ),
                (
                    f"{MEGATRON}/megatron/training/checkpointing.py",
                    1734,
                    "_load_base_checkpoint",
                    "return _load_global_dist_base_checkpoint(",
                ),
            )
            + f"\nFileNotFoundError: [Errno 2] No such file or directory: '{marker.parent}'"
        )
        raise LoadFailed(1)
    lo, hi = checkpoint_ms(job, pred, f"load-{it}", factor=1.2)  # read + reshard is a little slower
    time.sleep(min(hi / 1000.0 * job.twin.time_scale, 0.05))
    if _speaks_rank0(job):
        pp = job.layout.pp
        out(
            f"  successfully loaded checkpoint from {load} [ t 1/{job.layout.tp}, gtp_remat 1/1, p 1/{pp} ] "
            f"at iteration {it}"
        )
    if job.rank == job.world - 1:
        err(timers_block([("load-checkpoint", lo, hi)]))
    return it


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _nccl_group(job: TwinJob, rng: random.Random) -> str:
    lay = job.layout
    choices = [("ep", lay.ep > 1, 4), ("dp", True, 2), ("pp", lay.pp > 1, 1), ("cp", lay.cp > 1, 1)]
    pool = [name for name, ok, weight in choices if ok for _ in range(weight)]
    return NCCL_GROUPS[rng.choice(pool)]


def write_sidecars(job: TwinJob, pred: Prediction, measured: int) -> list[Path]:
    """sidecar-rank-<r>.json: what the router hook records on a real job, marked simulated."""
    if job.job_dir is None:
        return []
    ranks = (
        [job.rank]
        if not job.single_process
        else [r for r in dp0_ranks(job) if coords(job, r)["tp"] == 0 and coords(job, r)["cp"] == 0]
    )
    job.job_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in ranks:
        stage_idx = coords(job, r)["pp"]
        _alloc, max_alloc, _reserved, max_reserved = stage_memory(job, pred, stage_idx, r)
        doc = {
            "simulated": True,
            "source": "twin",
            "rank": r,
            "pp_stage": stage_idx,
            "window": {"warmup_iters": job.stage.warmup_iters, "measure_iters": measured},
            "peak_allocated_mb": round(max_alloc, 2),
            "peak_reserved_mb": round(max_reserved, 2),
            "capacity_factor": job.layout.capacity_factor,
            "force_balanced_routing": bool(_flag(job.flags, "moe_router_force_load_balancing", False)),
        }
        if coords(job, r)["tp"] == 0:  # TP replicas see the same tokens: only TP rank 0 counts them
            doc.update(routing(job, pred, r, measured))
        path = job.job_dir / f"sidecar-rank-{r}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    raise SystemExit(main())
