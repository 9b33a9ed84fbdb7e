"""Typed inputs and outputs of a searcher and the schedule. Pure data: the sweep loop builds them from ledger rows
only.

Why the policy sees only these: the loop decides from the ledger (never from a previous process's memory),
so a resumed orchestrator proposes exactly what a never-killed one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from orchestrator.core.decision import CutLine, Decision
from orchestrator.core.states import EdgeKind, Fidelity
from orchestrator.plan.layout import Layout
from orchestrator.plan.memory import MemoryScale

if TYPE_CHECKING:
    from orchestrator.search.calibrate import Fit


Rate = Callable[[Layout, float], float]  # how a searcher rates a layout from a predicted step (Policy.estimate)


def unrated(_layout: Layout, step_s: float) -> float:
    """The rating that takes a predicted step as it is (a searcher with no view of its own)."""
    return step_s


@dataclass(frozen=True)
class Observation:
    """One candidate of this stage as the ledger knows it: predicted (raw, factors = 1) and measured."""

    key: str
    layout: Layout
    raw_components: dict[str, float]  # planner components with no calibration (seconds)
    raw_step_s: float  # planner step time with no calibration
    raw_memory_gb: float  # planner heaviest-rank peak with no calibration
    step_s: float | None = None  # measured step p50 (None = no measurement)
    p99_s: float | None = None
    peak_gb: float | None = None  # measured heaviest-rank peak (reserved, else allocated)
    failure_class: str | None = None  # latest attempt's class when it did not succeed
    round: int = 0
    hbm_gb: float = 0.0  # capacity the job ran on, for headroom tie-breaks
    # per-term memory calibration: the planner's raw terms per PP stage (memory.TERMS -> GB) and the measured
    # peak of each PP stage (Megatron prints one memory line per stage from its DP-rank-0 ranks)
    raw_memory_terms: tuple[dict[str, float], ...] = ()
    stage_peaks_gb: dict[int, float] = field(default_factory=dict)
    fidelity: Fidelity = Fidelity.FULL  # of the measurement (step_s): screen rows rank, never decide a best
    measure_iters: int | None = None  # iterations its p50 is over (the screen's CI)
    partial: bool = False  # its job stopped before the window ended: it ranks nothing (orchestrator.core.ranking)
    # a rank probe's row: peak_gb (and stage_peaks_gb) are its measured peak + this, what a full-scale run would
    # reserve (what the probe cannot see: NCCL and dispatcher buffers, select.probe_margin_gb)
    probe_margin_gb: float = 0.0
    # a rank probe of this layout, while the probe is its latest measurement (a layout that ran at scale is
    # fitted on its whole step: orchestrator/sweep/history.py): the p50 of the compute-only step it measured (the
    # last rank's: orchestrator/search/compose.py) and the planner's raw view of the same number
    # (Prediction.probe_step_s). Never a step measurement.
    probe_step_s: float | None = None
    raw_probe_s: float | None = None
    # a layout rank-probed and then measured at scale: its probe's compute-only p50 (`Evidence.probes`), so what
    # its composed step was can be held against the step it measured (compose.scale_bias)
    earlier_probe_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fidelity", Fidelity(self.fidelity or Fidelity.FULL))

    @property
    def probe_scale(self) -> float | None:
        """Measured / predicted compute-only step of its rank probe (compose.components), None unprobed."""
        if self.probe_step_s and self.raw_probe_s and self.probe_step_s > 0 and self.raw_probe_s > 0:
            return self.probe_step_s / self.raw_probe_s
        return None

    @property
    def earlier_probe_scale(self) -> float | None:
        """`probe_scale` of the rank probe that came before its measurement at scale (None: none came before)."""
        if self.earlier_probe_s and self.raw_probe_s and self.earlier_probe_s > 0 and self.raw_probe_s > 0:
            return self.earlier_probe_s / self.raw_probe_s
        return None

    @property
    def ok(self) -> bool:
        return self.step_s is not None and self.step_s > 0

    @property
    def probed_fit(self) -> bool:
        """A fit probe ran it and it fit: its peak (a rank probe's: + the probe margin) is under HBM; its speed
        is not measured. Known to fit, so due a real measurement."""
        return self.probe_ran and (not self.hbm_gb or (self.peak_gb or 0.0) <= self.hbm_gb)

    @property
    def probe_ran(self) -> bool:
        """A rank probe ran it without an OOM: it fits (`probed_fit`), or its peak is too close to HBM to call
        once the probe margin is added. Either way only a launch at scale can say more, and an OOM there costs
        start-up and an iteration, so such a layout is due one when it looks fast enough (round.passed)."""
        return self.fidelity == Fidelity.PROBE and self.peak_gb is not None and self.failure_class is None

    @property
    def measured_step_s(self) -> float:
        """step_s of a row known to be measured (`ok`): the policy's arithmetic never meets a None."""
        if self.step_s is None:
            raise ValueError(f"candidate {self.key[:10]} has no measured step time")
        return self.step_s

    @property
    def measured_peak_gb(self) -> float:
        """peak_gb of a row known to carry one."""
        if self.peak_gb is None:
            raise ValueError(f"candidate {self.key[:10]} has no measured peak memory")
        return self.peak_gb

    @property
    def headroom_gb(self) -> float:
        return (self.hbm_gb - self.peak_gb) if self.peak_gb is not None and self.hbm_gb else 0.0


@dataclass
class Proposal:
    """A layout the policy wants measured, with why (edge_kind) and from what (parent_key)."""

    key: str
    layout: Layout
    predicted: dict  # calibrated prediction (Prediction fields) + raw_components / factors used
    reason: str  # round0 | neighbour:<knob> | joint:<knob>+<knob> | model-pick | model-top | promoted | ...
    parent_key: str | None = None
    edge_kind: EdgeKind | None = None
    est_gpu_hours: float = 0.0
    # why, as the ledger stores it (candidate.decision): the move kind (the reason before any ':'), the
    # fidelity it is measured at, the predicted gain over the best measured step and its uncertainty (sd)
    fidelity: Fidelity = Fidelity.FULL
    measure_iters: int | None = None  # a screen's measured window (schedule/fidelity.screen_iters)
    predicted_gain: float | None = None
    uncertainty: float | None = None
    probe_ranks: tuple[int, ...] = ()  # a rank probe's ranks of the N-GPU job (orchestrator.plan.ranks.probe_ranks)
    # warm start (stage.warm_start, steps/warm_start.warm): this launch saves the sweep's seed at its end, or loads it
    warm_from: str | None = None  # the seed's checkpoint folder
    charge_step_s: float | None = None  # the step est_gpu_hours is charged at (None: the predicted step)
    seed_save: bool = False
    after_seed: bool = False  # waits for the seed its round's first launch saves (orchestrator/sweep/seeding.py)
    warmup_iters: int | None = None  # a warm launch's learned warm-up (schedule/fidelity.learned_warmup), if any
    cut: CutLine | None = None  # its early cut (core/decision.CutLine), set by the early_cut step

    def __post_init__(self) -> None:
        self.fidelity = Fidelity(self.fidelity or Fidelity.FULL)

    @property
    def kind(self) -> str:
        """The reason's first word: `neighbour:<knob>` and `model-top (revived: ...)` are kinds
        neighbour and model-top."""
        return self.reason.split(":", 1)[0].split(" ", 1)[0]

    def decision(self) -> Decision:
        """The explained decision stored with the candidate (db column candidate.decision, core/decision.py)."""
        return Decision(
            kind=self.kind,
            move=self.reason,
            fidelity=self.fidelity,
            measure_iters=self.measure_iters,
            predicted_gain=self.predicted_gain,
            uncertainty=self.uncertainty,
            parent=self.parent_key,
            revived="revived" in self.predicted,  # pruned by the uncalibrated memory model, fits calibrated
            probe_ranks=self.probe_ranks,
            warm_from=self.warm_from,
            seed_save=self.seed_save,
            after_seed=self.after_seed,
            warmup_iters=self.warmup_iters,
            cut=self.cut,
        )

    @property
    def predicted_step_s(self) -> float:
        return float(self.predicted.get("step_time_s") or 0.0)


@dataclass
class RoundInput:
    """What a policy needs to propose one round, all read from the ledger by the loop."""

    round: int
    observations: list[Observation]  # every candidate of this stage and model with its latest outcome
    known_keys: set[str]  # every key already in this sweep (or rejected by its preflight): never launched again
    slots: int  # runs the budget still allows this round
    gpu_hours_left: float
    source: list[Observation] = field(default_factory=list)  # promotion source stage (round 0 only)
    step_cv: float | None = None  # measured step-time noise of this stage (schedule/fidelity.robust_cv), if any
    seed: str | None = None  # the routing-settled checkpoint later launches load (history.seed), once one was saved
    seedless: bool = False  # a launch measured that was to save the seed and saved none: no warm start again
    # how many leading iterations this sweep's warm-started launches ran above their steady step (settled_iters):
    # what a warm start's warm-up is learned from (schedule/fidelity.learned_warmup)
    settled: tuple[int, ...] = ()


@dataclass
class RoundPlan:
    proposals: list[Proposal]  # new candidates
    fit: Fit | None = None
    reason: str = ""
    # measured candidates to run again at the full window (screened contenders): same key, new attempt
    confirms: list[Proposal] = field(default_factory=list)
    rate: Rate = unrated  # the searcher's rating this round (Policy.estimate): what a probed layout passes by
    held: tuple[str, ...] = ()  # the steps' reasons the sweep may not converge yet (unmeasured disputed layouts)


def prediction_dict(
    prediction,
    *,
    raw_components: dict[str, float],
    raw_step_s: float,
    raw_memory_gb: float,
    factors: dict[str, float] | None = None,
    memory_factor: MemoryScale = 1.0,
) -> dict:
    """Serialize a Prediction for the ledger, keeping the raw (uncalibrated) numbers calibration needs."""
    d = asdict(prediction) if hasattr(prediction, "__dataclass_fields__") else dict(prediction)
    d["memory_by_stage"] = list(d.get("memory_by_stage") or ())
    d["raw_components"] = dict(raw_components)
    d["raw_step_time_s"] = raw_step_s
    d["raw_memory_gb"] = raw_memory_gb
    d["factors"] = dict(factors or {})
    d["memory_factor"] = dict(memory_factor) if isinstance(memory_factor, Mapping) else memory_factor
    return d
