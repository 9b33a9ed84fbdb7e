"""Typed rows the Ledger hands out (and CandidateIn, what it takes): plain dataclasses, so nothing
tied to a database session escapes db/.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

# Slurm states after which an attempt will not change by itself (PREEMPTED may be requeued: live).
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "LOST"}
)


@dataclass(frozen=True)
class SweepRow:
    id: int
    name: str
    stage: str
    model: str
    hardware: str
    workload: str
    config_yaml: str
    status: str
    provenance: dict
    created_at: datetime
    updated_at: datetime


@dataclass
class CandidateIn:
    """A planned candidate. layout = Layout.to_dict(); predicted = Prediction fields (asdict)."""

    key: str
    layout: dict
    layer_pattern: str = ""
    predicted: dict = field(default_factory=dict)
    verdict: str | Sequence[str] = "legal"  # "legal" or the ids of the rules it breaks
    round: int = 0
    parent_key: str | None = None
    edge_kind: str | None = None  # neighbour-of | promoted-from
    status: str = "planned"


@dataclass(frozen=True)
class CandidateRow:
    id: int
    sweep_id: int
    key: str
    layout: dict
    layer_pattern: str
    predicted: dict
    verdict: str
    round: int
    parent_id: int | None
    edge_kind: str | None
    status: str
    reason: str | None
    claimed_by: str | None
    latest_attempt_id: int | None
    latest_result_id: int | None
    created_at: datetime
    updated_at: datetime


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
    state: str
    failure_class: str | None
    failure_detail: str | None
    exit_code: int | None
    log_paths: list
    sidecar_paths: list
    simulated: bool
    created_at: datetime
    updated_at: datetime

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class EventRow:
    id: int
    sweep_id: int
    candidate_id: int | None
    kind: str
    message: str
    data: dict | None
    created_at: datetime


@dataclass(frozen=True)
class CalibrationRow:
    id: int
    sweep_id: int
    round: int
    fit: dict
    error: dict
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
    status: str
    layout: dict
    layer_pattern: str
    predicted: dict
    verdict: str
    attempt_id: int
    attempt_no: int
    job_id: str | None
    simulated: bool
    partial: bool
    metrics: dict  # every result column (RESULT_METRICS)
