"""Typed rows the Ledger hands out (and CandidateIn, what it takes): plain dataclasses, so nothing
tied to a database session escapes orchestrator/ledger/. States and statuses come back as orchestrator.core.states'
enums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.core.decision import NO_DECISION, Decision
from orchestrator.core.knobs import Layout
from orchestrator.core.metrics import Measured
from orchestrator.core.prediction import Predicted, Prediction
from orchestrator.core.ranking import Standing
from orchestrator.core.ranking import standing as standing_of
from orchestrator.core.states import AttemptRole, AttemptState, CandidateStatus, EdgeKind, Fidelity, SweepStatus
from orchestrator.ledger.convert import decode


def _set(row: object, name: str, value: object) -> None:
    """Assign in __post_init__ of a frozen row (the stored text becomes its enum member)."""
    object.__setattr__(row, name, value)


@dataclass(frozen=True)
class SweepRow:
    id: int
    name: str
    stage: str
    model: str
    hardware: str
    workload: str
    config_yaml: str
    status: SweepStatus
    provenance: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    def __post_init__(self) -> None:
        _set(self, "status", SweepStatus(self.status))


@dataclass
class CandidateIn:
    """A planned candidate. predicted = Prediction fields (asdict) and the calibration's extras."""

    key: str
    layout: Layout
    layer_pattern: str = ""
    predicted: dict[str, Any] = field(default_factory=dict)
    verdict: str | Sequence[str] = "legal"  # "legal" or the ids of the rules it breaks
    round: int = 0
    parent_key: str | None = None
    edge_kind: EdgeKind | None = None
    status: CandidateStatus = CandidateStatus.PLANNED
    decision: Decision | None = None  # why it was proposed (orchestrator.search.types.Proposal.decision)

    def __post_init__(self) -> None:
        """A layout or decision handed in as its stored JSON (a job folder's job.json, a test) is decoded here."""
        self.layout = decode("layout", self.layout)
        self.decision = None if self.decision is None else decode("decision", self.decision)


@dataclass(frozen=True)
class CandidateRow:
    id: int
    sweep_id: int
    key: str
    layout: Layout
    layer_pattern: str
    predicted: Predicted  # the stored prediction, decoded once (orchestrator/ledger/convert.py)
    verdict: str
    round: int
    parent_id: int | None
    edge_kind: EdgeKind | None
    status: CandidateStatus
    reason: str | None
    claimed_by: str | None
    latest_attempt_id: int | None
    latest_result_id: int | None
    created_at: datetime
    updated_at: datetime
    decision: Decision = NO_DECISION  # decoded once (orchestrator/ledger/convert.py)

    def __post_init__(self) -> None:
        _set(self, "status", CandidateStatus(self.status))
        _set(self, "edge_kind", None if self.edge_kind is None else EdgeKind(self.edge_kind))

    @property
    def prediction(self) -> Prediction | None:
        """The models' prediction (`predicted` holds it with the search's extras: raw components, factors);
        None for a candidate stored without one."""
        return self.predicted.models


@dataclass(frozen=True)
class AttemptRow:
    id: int
    candidate_id: int
    attempt_no: int
    job_id: str | None
    array_index: int | None
    job_dir: str
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    node_list: str | None
    state: AttemptState
    failure_class: str | None
    failure_detail: str | None
    exit_code: int | None
    log_paths: list[str]
    sidecar_paths: list[str]
    simulated: bool
    created_at: datetime
    updated_at: datetime
    launch_token: str | None = None  # the launch intent (Slurm job name); see Ledger.new_attempt
    fidelity: Fidelity = Fidelity.FULL  # probe | screen | full
    role: AttemptRole = AttemptRole.MEASURE  # what the job is for; only MEASURE is the candidate's measurement

    def __post_init__(self) -> None:
        _set(self, "state", AttemptState.parse(self.state))  # a word Slurm adds later reads UNKNOWN: live
        _set(self, "fidelity", Fidelity(self.fidelity or Fidelity.FULL))
        _set(self, "role", AttemptRole(self.role))

    @property
    def measures(self) -> bool:
        """The search's measurement of its candidate (not a finalist's parity or long-run job)."""
        return self.role == AttemptRole.MEASURE

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def aborted(self) -> bool:
        """A launch intent that never ran (ended without a job id): not an attempt that counts for retries."""
        return self.job_id is None and self.terminal


@dataclass(frozen=True)
class EventRow:
    id: int
    sweep_id: int
    candidate_id: int | None
    kind: str
    message: str
    data: dict[str, Any] | None
    created_at: datetime


@dataclass(frozen=True)
class CalibrationRow:
    id: int
    sweep_id: int
    round: int
    fit: dict[str, Any]
    error: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class ParityRow:
    id: int
    candidate_id: int
    reference_key: str
    steps: int
    max_loss_diff: float | None
    max_grad_norm_diff: float | None
    tolerance: float
    passed: bool
    detail: str
    created_at: datetime


@dataclass(frozen=True)
class MeasuredRow:
    """What the policy learns from: the layout, what was predicted, and the latest successful result."""

    sweep: str
    stage: str
    model: str
    hardware: str
    candidate_id: int
    key: str
    round: int
    status: CandidateStatus
    layout: Layout
    layer_pattern: str
    predicted: Predicted
    verdict: str
    attempt_id: int
    attempt_no: int
    job_id: str | None
    simulated: bool
    partial: bool
    metrics: Measured  # every result column, typed by the registry (core/metrics)
    fidelity: Fidelity = Fidelity.FULL  # the measuring attempt's: only FULL decides a best
    excluded: bool = False  # failed the correctness gate (status excluded, or a failing parity check)
    result_id: int = 0

    def __post_init__(self) -> None:
        _set(self, "status", CandidateStatus(self.status))
        _set(self, "fidelity", Fidelity(self.fidelity or Fidelity.FULL))

    @property
    def standing(self) -> Standing:
        """How orchestrator.core.ranking sees this measurement (`ranking.best(rows, standing)`, standing below)."""
        return standing_of(
            self.metrics, fidelity=self.fidelity, partial=self.partial, excluded=self.excluded, order=self.result_id
        )


def standing(row: MeasuredRow) -> Standing:
    """`row.standing`, as the callable orchestrator.core.ranking's `ranked` / `best` take."""
    return row.standing


@dataclass(frozen=True)
class CapacityRow:
    """What one attempt's evidence said the GPU holds (orchestrator.sweep.capacity reads these)."""

    attempt_id: int
    candidate_id: int
    job_id: str | None
    gb: float  # decimal GB
    source: str  # "OOM message" | "device properties" (orchestrator.evidence.metrics)
