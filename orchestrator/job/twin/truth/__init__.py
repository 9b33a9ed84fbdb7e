"""The simulated machine: what a layout costs in step time and memory. Not the planner.

The truth has its own formulas (shape.py: what the model's blocks hold and cost; machine.py: how the
machine runs them) and imports nothing from orchestrator/plan/ (tests/job/test_truth.py checks it, transitively),
so calibrating the planner on twin measurements is a real test: the planner's structure is wrong here the
way it is wrong on a real cluster. TwinConfig.surface picks which effect dominates and TwinConfig.seed draws
its hidden constants (surfaces.py), which moves the optimum.

Everything else in the twin sees only what this package returns: a `Surface` per layout, per-iteration step
times, per-rank memory figures, Megatron's timer split and checkpoint sizes. Legality is not decided here
(orchestrator/job/twin/legal.py applies Megatron's own assertions); a stage over the GPU's capacity
(`capacity_gb`) is the caller's OOM, decided on `Surface.stage_gb` (the truth's peak reserved memory, no margin).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig, TwinConfig
from orchestrator.job.twin.truth import machine
from orchestrator.job.twin.truth.shape import shape
from orchestrator.job.twin.truth.surfaces import quirks

MIB = 1024 * 1024


@dataclass(frozen=True)
class Case:
    """One job as the truth needs it: `stage.gpus` is the job's world size; `layout` is any object with the
    knob attributes (tp, pp, vpp, cp, ep, etp, mbs, recompute, offload, dispatcher, flex_backend,
    capacity_factor); `pattern` is its --hybrid-layer-pattern ('' = an even split)."""

    model: ModelConfig
    hw: HardwareConfig
    stage: StageConfig
    twin: TwinConfig
    layout: object
    pattern: str = ""


@dataclass(frozen=True)
class Surface:
    """What the simulated machine does with one layout (SIMULATED numbers)."""

    step_s: float  # one step's seconds before run-to-run noise and stragglers
    forward_backward_s: float
    grad_sync_s: float
    optimizer_s: float
    stage_s: tuple[float, ...]  # per-microbatch seconds of each pipeline stage (the slowest paces the pipeline)
    stage_gb: tuple[float, ...]  # peak reserved memory of one rank per pipeline stage (GB)
    stage_allocated_gb: tuple[float, ...]
    # a one-GPU rank probe of a stage's rank (Megatron's --fake-process-group): what it reserves (no NCCL nor
    # dispatcher buffers) and one step of its compute alone (no collective, no all-to-all, no bubble)
    stage_probe_gb: tuple[float, ...]
    stage_probe_s: tuple[float, ...]
    checkpoint_gb: tuple[float, ...]  # per stage: what one rank writes (weights + optimizer state)
    flops_per_step: float
    tail_prob: float  # probability of a straggler step for this layout
    tail_factor: float
    noise_sigma: float

    def memory_gb(self, stage_idx: int) -> float:
        return self.stage_gb[min(stage_idx, len(self.stage_gb) - 1)]


def capacity_gb(hw: HardwareConfig, twin: TwinConfig) -> float:
    """What the simulated GPU holds (decimal GB): TwinConfig.gpu_capacity_gb, else the hardware group's HBM.
    A stage whose peak reserved memory exceeds it OOMs; torch's message and the sidecars state it."""
    return float(twin.gpu_capacity_gb) if twin.gpu_capacity_gb else float(hw.hbm_gb)


def knobs(layout) -> machine.Knobs:
    """The machine's view of a layout object (a dispatcher label carries the flex backend)."""
    disp = str(layout.dispatcher)
    if disp == "flex":
        disp = f"flex:{layout.flex_backend}"
    return machine.Knobs(
        tp=int(layout.tp),
        pp=int(layout.pp),
        vpp=int(layout.vpp),
        cp=int(layout.cp),
        ep=int(layout.ep),
        etp=int(layout.etp),
        mbs=int(layout.mbs),
        recompute=tuple(layout.recompute),
        offload=tuple(layout.offload),
        dispatcher=disp,
        capacity_factor=layout.capacity_factor,
        precision=str(getattr(layout, "precision", "bf16")),
    )


def evaluate(case: Case) -> Surface:
    """The layout's surface under the case's twin surface and seed. Deterministic."""
    model, stage, twin = case.model, case.stage, case.twin
    lay = knobs(case.layout)
    blocks = stage.num_layers_override or model.num_layers
    sh = shape(model, stage.seq_length, case.pattern, lay.pp, lay.vpp, blocks)
    r = machine.run(model, case.hw, stage, lay, sh, quirks(twin.surface, twin.seed), twin.routing_skew)
    return Surface(
        step_s=r.step_s,
        forward_backward_s=r.forward_backward_s,
        grad_sync_s=r.grad_sync_s,
        optimizer_s=r.optimizer_s,
        stage_s=r.stage_s,
        stage_gb=tuple(s.reserved for s in r.memory),
        stage_allocated_gb=tuple(s.allocated for s in r.memory),
        stage_probe_gb=tuple(s.probe_reserved for s in r.memory),
        stage_probe_s=r.probe_s,
        checkpoint_gb=tuple(s.weights + s.optimizer for s in r.memory),
        flops_per_step=r.flops_per_step,
        tail_prob=min(0.5, twin.tail_prob * r.tail_scale),
        tail_factor=twin.tail_factor,
        noise_sigma=twin.noise_sigma,
    )


def rank_probe(surface: Surface, stage_idx: int) -> Surface:
    """The surface one rank of `stage_idx` shows alone on one GPU under a fake process group: its own
    memory (no NCCL, no dispatcher buffers) on every stage's slot, and its compute-only step, with no
    gradient sync. The twin's probe mode runs on it (orchestrator/job/twin/loop.py)."""
    i = min(stage_idx, len(surface.stage_gb) - 1)
    gb, alloc, step = surface.stage_probe_gb[i], surface.stage_allocated_gb[i], surface.stage_probe_s[i]
    n = len(surface.stage_gb)
    return replace(
        surface,
        step_s=step,
        forward_backward_s=max(0.0, step - surface.optimizer_s),
        grad_sync_s=0.0,
        stage_gb=(gb,) * n,
        stage_allocated_gb=(alloc - (surface.stage_gb[i] - gb),) * n,
        tail_prob=0.0,  # no straggler to wait for: no collective
    )


# ------------------------------------------------------------------------------------------ per run
def step_times(surface: Surface, n: int, rng: random.Random) -> list[float]:
    """Per-iteration seconds for the `n` iterations one process runs: the surface's step x lognormal noise,
    x tail_factor with the layout's straggler rate, and a warm-up effect that fades over the first
    iterations after the process starts (compile, NCCL setup, allocator), after a restart too."""
    out = []
    for i in range(n):
        s = surface.step_s * math.exp(rng.gauss(0.0, surface.noise_sigma)) * (1.0 + 2.0 * math.exp(-i / 1.0))
        if rng.random() < surface.tail_prob:
            s *= surface.tail_factor
        out.append(s)
    return out


def rank_memory(surface: Surface, stage_idx: int, salt: str) -> tuple[float, float, float, float]:
    """(allocated, max allocated, reserved, max reserved) MB for one rank of a pipeline stage, with a small
    per-rank spread (salt: the job key and rank) across TP / CP positions."""
    i = min(stage_idx, len(surface.stage_gb) - 1)
    jitter = 1.0 + 0.004 * (random.Random(salt).random() - 0.5)
    max_reserved = surface.stage_gb[i] * 1e9 / MIB * jitter
    max_alloc = surface.stage_allocated_gb[i] * 1e9 / MIB * jitter
    return max_alloc * 0.55, max_alloc, max_reserved * 0.97, max_reserved


def timer_rows(surface: Surface, step_s: float, rng: random.Random) -> list[tuple[str, float, float]]:
    """Megatron's level-1 timers, (min, max) across ranks in ms, from the step's parts scaled to `step_s`."""
    scale = step_s * 1000.0 / max(surface.step_s, 1e-12)
    opt, sync = surface.optimizer_s * scale, surface.grad_sync_s * scale
    fb = step_s * 1000.0 - opt - sync
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
