"""Typed rows the Ledger hands out (and CandidateIn, what it takes): plain dataclasses, so nothing
tied to a database session escapes db/.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional, Sequence, Union

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
    verdict: Union[str, Sequence[str]] = "legal"  # "legal" or the ids of the rules it breaks
    round: int = 0
    parent_key: Optional[str] = None
    edge_kind: Optional[str] = None  # neighbour-of | promoted-from
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
    parent_id: Optional[int]
    edge_kind: Optional[str]
    status: str
    reason: Optional[str]
    claimed_by: Optional[str]
    latest_attempt_id: Optional[int]
    latest_result_id: Optional[int]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class AttemptRow:
    id: int
    candidate_id: int
    attempt_no: int
    job_id: Optional[str]
    array_index: Optional[int]
    job_dir: str
    submit_time: Optional[datetime]
    start_time: Optional[datetime]
    end_time: Optional[datetime]
    node_list: Optional[str]
    state: str
    failure_class: Optional[str]
    failure_detail: Optional[str]
    exit_code: Optional[int]
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
    candidate_id: Optional[int]
    kind: str
    message: str
    data: Optional[dict]
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
    max_loss_diff: Optional[float]
    max_grad_norm_diff: Optional[float]
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
    job_id: Optional[str]
    simulated: bool
    partial: bool
    metrics: dict  # every result column (RESULT_METRICS)
