"""The simulated machine: what a layout costs in step time and memory. The twin's only door to the planner.

Today the truth is the planner's own models evaluated under HIDDEN factors (TwinConfig.truth_compute /
truth_a2a / truth_bubble / truth_memory, so calibration has something to learn) with no memory margin (an
OOM means more than HBM), times a smooth seed-dependent per-knob perturbation (so the truth is not the
model times a constant). Everything else in the twin sees only what this module returns: a `Surface` (or
`Illegal`), per-iteration step times, per-rank memory figures, the timer split and checkpoint sizes. A
planner-independent surface replaces `evaluate` without touching the rest of the twin.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, replace

from jobs.twin.job import TwinJob, job_rng
from jobs.twin.text import MIB
from orchestrator.knobs import KNOBS
from orchestrator.plan import memory as plan_memory
from orchestrator.plan import pipeline, planner
from orchestrator.plan.layout import Layout, groups
from orchestrator.schema import TwinConfig


@dataclass(frozen=True)
class Surface:
    """What the simulated machine does with one legal layout."""

    step_s: float  # one step's seconds before run-to-run noise (perturbation included)
    components: dict[str, float]  # the step's parts, keyed like the step-time model's components
    stage_gb: tuple[float, ...]  # peak memory of one rank per pipeline stage (GB)
    flops_per_step: float
    layer_pattern: str  # the hybrid pattern the layout runs (segments per virtual stage, MTP after '/')

    def memory_gb(self, stage_idx: int) -> float:
        return self.stage_gb[min(stage_idx, len(self.stage_gb) - 1)]


@dataclass(frozen=True)
class Illegal:
    """Megatron refuses the layout: the first violated rule (id and one-line reason)."""

    rule_id: str
    reason: str


def evaluate(job: TwinJob) -> Surface | Illegal:
    """The layout's surface, or Illegal. A layout rejected only for memory is legal: it just does not fit,
    so its surface is evaluated on unbounded HBM and the caller sees which stages exceed the real HBM."""
    result = _truth(job)
    if isinstance(result, planner.Rejected):
        if not all(getattr(r, "phase", "") == "memory" for r in result.rules):
            first = result.rules[0]
            return Illegal(first.id, first.reason)
        result = _truth(job, hbm_gb=math.inf)
    pred = result.prediction
    return Surface(
        step_s=pred.step_time_s * perturbation(job.layout, job.twin.seed),
        components=dict(pred.step_components or {}),
        stage_gb=tuple(pred.memory_by_stage or (pred.memory_gb,)),
        flops_per_step=pred.flops_per_step,
        layer_pattern=pred.layer_pattern,
    )


def _truth(job: TwinJob, hbm_gb: float | None = None):
    """planner.evaluate under the hidden truth factors, with no memory margin (OOM means > HBM)."""
    hw = job.hw if hbm_gb is None else replace(job.hw, hbm_gb=hbm_gb)
    stage = replace(job.stage, memory_margin_gb=0.0)
    return planner.evaluate(
        job.model, hw, stage, job.layout, factors=_factors(job.twin), memory_factor=job.twin.truth_memory
    )


def _factors(twin: TwinConfig) -> dict[str, float]:
    """The truth multipliers, keyed by the step-time model's COMPONENTS."""
    return {"compute": twin.truth_compute, "a2a": twin.truth_a2a, "bubble": twin.truth_bubble}


def perturbation(layout: Layout, seed: int, amplitude: float = 0.06) -> float:
    """A smooth, seed-dependent multiplier per knob, so the truth is not the model times a constant.

    Numeric knobs vary as a sine of log2(value) (neighbours differ a little, far values more);
    categorical knobs (dispatcher, recompute, offload) get a fixed seeded offset each.
    """
    r = random.Random(f"twin-surface-{seed}")
    log_mult = 0.0
    for knob in (k.name for k in KNOBS if k.type is int):
        a, w, ph = r.uniform(0.3, 1.0), r.uniform(0.6, 1.4), r.uniform(0, 2 * math.pi)
        log_mult += amplitude * a * math.sin(w * math.log2(max(1, getattr(layout, knob))) + ph) / 3
    for label in (layout.dispatcher_label, "+".join(layout.recompute), "+".join(layout.offload)):
        h = int(hashlib.sha256(f"{seed}:{label}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        log_mult += amplitude * (h - 0.5) / 2
    return math.exp(log_mult)


# ------------------------------------------------------------------------------------------ per run
def step_times(job: TwinJob, surface: Surface, n: int | None = None, start: int = 0) -> list[float]:
    """Per-iteration seconds for the `n` iterations this process runs: the surface's step x lognormal
    noise, x tail_factor with tail_prob, and a warm-up effect that fades over the first iterations after
    the process starts (compile, NCCL setup, allocator), after a restart too."""
    t = job.twin
    base = surface.step_s
    rng = job_rng(job, "steps") if not start else job_rng(job, "steps", start)  # a restored run draws anew
    out = []
    for i in range(job.train_iters if n is None else n):
        s = base * math.exp(rng.gauss(0.0, t.noise_sigma)) * (1.0 + 2.0 * math.exp(-i / 1.0))
        if rng.random() < t.tail_prob:
            s *= t.tail_factor
        out.append(s)
    return out


def rank_memory(job: TwinJob, surface: Surface, stage_idx: int, rank: int) -> tuple[float, float, float, float]:
    """(allocated, max allocated, reserved, max reserved) MB for one rank: max reserved is the truth
    memory of its pipeline stage, with a small per-rank spread across TP/CP positions."""
    gb = surface.memory_gb(stage_idx)
    jitter = 1.0 + 0.004 * (random.Random(f"{job.key}-{rank}").random() - 0.5)
    max_reserved = gb * 1e9 / MIB * jitter
    max_alloc = max_reserved * 0.93
    return max_alloc * 0.55, max_alloc, max_reserved * 0.97, max_reserved


def timer_rows(surface: Surface, step_s: float, rng: random.Random) -> list[tuple[str, float, float]]:
    """Megatron's level-1 timers, (min, max) across ranks in ms, from the step's components."""
    comp = surface.components
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


def checkpoint_gb(job: TwinJob, surface: Surface) -> list[float]:
    """Per PP stage: the GB one rank writes (its weights + optimizer state, the memory model's parts)."""
    lay = job.layout
    mems = plan_memory.stage_memory(
        job.model,
        job.hw,
        job.stage,
        lay,
        groups(lay, job.world, job.stage.global_batch),
        pipeline.count_blocks(surface.layer_pattern),
    )
    return [m.weights + m.optimizer for m in mems]
