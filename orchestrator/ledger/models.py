"""The ledger schema (SQLAlchemy 2 typed ORM). Alembic revisions in orchestrator/ledger/migrations/versions build it.

Why these shapes:
- Every knob is its own column so `compare --where ep=64` is an indexed SQL filter, not JSON parsing;
  the columns come from the knob registry (KnobColumns); the full `Layout.to_dict()` is also kept
  (layout) as the source of truth for round-tripping.
- Unique (sweep_id, key) and (candidate_id, attempt_no) make re-running a sweep idempotent.
- candidate.latest_attempt_id / latest_result_id are pointers the ledger maintains in the same
  transaction as the attempt / result, so `compare` over 100k runs is a join on primary keys. They point
  at measure-role attempts only (attempt.role): a finalist's job never becomes the candidate's measurement.
  They carry no foreign key (that would make candidate <-> attempt a cycle).
- Times are stored as naive UTC and handed back timezone-aware (SQLite has no time zones).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedColumn, mapped_column

from orchestrator.core.knobs import KNOBS, Knob, column_value
from orchestrator.core.metrics import METRICS, Metric
from orchestrator.core.states import AttemptRole, AttemptState, CandidateStatus, Fidelity, SweepStatus


class UTCDateTime(TypeDecorator[datetime]):
    """Naive UTC in the database, aware UTC in Python."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[str]: JSON, Any: JSON}


class Sweep(Base):
    __tablename__ = "sweep"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    stage: Mapped[str] = mapped_column(String(50))
    model: Mapped[str] = mapped_column(String(100))
    hardware: Mapped[str] = mapped_column(String(100))
    workload: Mapped[str] = mapped_column(String(100))
    config_yaml: Mapped[str] = mapped_column(Text)  # the resolved config snapshot
    status: Mapped[str] = mapped_column(String(30), default=SweepStatus.PLANNED)
    # project version, Megatron commit / container image, submitit/torch/TE versions, perf env vars
    provenance: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Lease(Base):
    """One row per driven sweep: who drives it and until when (see Ledger.acquire_lease)."""

    __tablename__ = "lease"
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweep.id", ondelete="CASCADE"), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    acquired_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


class KnobColumns:
    """One column per knob of the registry (orchestrator/core/knobs.py), added below: a knob's column comes with
    the knob. Module sets (recompute, offload) are "+"-joined, "none" when empty; the flex backend is the
    column `backend`. A mixin, so Candidate's knob columns are the registry's and nothing else."""


def _knob_column(k: Knob) -> MappedColumn[Any]:
    sql = String(k.length) if k.sql == "str" else {"int": Integer, "float": Double, "bool": Boolean}[k.sql]()
    return mapped_column(k.column, sql, nullable=k.nullable, default=column_value(k, k.default))


for _knob in KNOBS:
    setattr(KnobColumns, _knob.column, _knob_column(_knob))


class Candidate(KnobColumns, Base):
    __tablename__ = "candidate"
    __table_args__ = (
        UniqueConstraint("sweep_id", "key"),
        Index("ix_candidate_sweep_status", "sweep_id", "status"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweep.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(64))  # canonical_key(layout, model, stage, hardware, workload)
    # one column per knob: KnobColumns, from the registry
    layer_pattern: Mapped[str] = mapped_column(Text, default="")
    layout: Mapped[dict[str, Any]]  # Layout.to_dict()
    # predictions (Prediction fields); the headline ones as columns for sorting
    pred_step_time_s: Mapped[float | None]
    pred_memory_gb: Mapped[float | None]
    pred_mfu: Mapped[float | None]
    pred_tokens_per_s: Mapped[float | None]
    pred_bubble: Mapped[float | None]
    d_a: Mapped[int | None]
    d_e: Mapped[int | None]
    m: Mapped[int | None]
    feasible: Mapped[bool | None]
    predicted: Mapped[dict[str, Any]] = mapped_column(default=dict)
    verdict: Mapped[str] = mapped_column(String(500), default="legal")  # "legal" or comma-joined rule ids
    round: Mapped[int] = mapped_column(default=0)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("candidate.id", ondelete="SET NULL"))
    edge_kind: Mapped[str | None] = mapped_column(String(30))  # orchestrator.core.states.EdgeKind
    # why the policy proposed it: {kind, move, fidelity, predicted_gain, uncertainty, parent} (Proposal.decision)
    decision: Mapped[dict[str, Any] | None]
    status: Mapped[str] = mapped_column(String(20), default=CandidateStatus.PLANNED)
    reason: Mapped[str | None] = mapped_column(Text)  # why the last status change happened
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    latest_attempt_id: Mapped[int | None]
    latest_result_id: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Attempt(Base):
    __tablename__ = "attempt"
    __table_args__ = (UniqueConstraint("candidate_id", "attempt_no"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidate.id", ondelete="CASCADE"))
    attempt_no: Mapped[int]
    job_id: Mapped[str | None] = mapped_column(String(64))
    array_index: Mapped[int | None]
    job_dir: Mapped[str] = mapped_column(Text)
    submit_time: Mapped[datetime | None]
    start_time: Mapped[datetime | None]
    end_time: Mapped[datetime | None]
    node_list: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(30), default=AttemptState.PENDING)  # Slurm's word
    failure_class: Mapped[str | None] = mapped_column(String(30))
    failure_detail: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None]
    log_paths: Mapped[list[str]] = mapped_column(default=list)
    sidecar_paths: Mapped[list[str]] = mapped_column(default=list)
    simulated: Mapped[bool]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # The launch intent, stored before sbatch and used as the Slurm job name: `resume` finds by it a job whose
    # id was never stored (killed between sbatch and the record), instead of launching it again.
    launch_token: Mapped[str | None] = mapped_column(String(160))
    # How long it measured (states.Fidelity, revision 0007): only FULL results decide a best.
    fidelity: Mapped[str] = mapped_column(String(10), default=Fidelity.FULL, server_default=Fidelity.FULL)
    # What the GPU holds, as this attempt's evidence stated it (revision 0008): decimal GB, from torch's OOM message
    # or the device properties a sidecar recorded; the sweep plans with it instead of hardware.hbm_gb.
    gpu_capacity_gb: Mapped[float | None]
    gpu_capacity_source: Mapped[str | None] = mapped_column(String(40))
    # What the job is for (states.AttemptRole, revision 0009): only MEASURE attempts are the candidate's
    # measurement (latest_attempt_id / latest_result_id point at them); the finalists' jobs are evidence.
    role: Mapped[str] = mapped_column(String(20), default=AttemptRole.MEASURE, server_default=AttemptRole.MEASURE)


class ResultColumns:
    """One column per metric of the registry (orchestrator/core/metrics.py), added below: a metric's column comes
    with the metric. A mixin, so Result's measurement columns are the registry's and nothing else."""


def _metric_column(k: Metric) -> MappedColumn[Any]:
    sql = {"float": Double, "int": Integer, "bool": Boolean, "text": Text, "json": JSON}.get(k.sql)
    kind = String(k.length) if k.sql == "str" else sql()  # type: ignore[misc]
    default = dict if isinstance(k.default, dict) else k.default
    return mapped_column(k.name, kind, nullable=k.nullable, default=default)


for _metric in METRICS:
    setattr(ResultColumns, _metric.name, _metric_column(_metric))


class Result(ResultColumns, Base):
    """One row per successful attempt: the JobResult metrics, one column each (ResultColumns, from the registry)."""

    __tablename__ = "result"
    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempt.id", ondelete="CASCADE"), unique=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidate.id", ondelete="CASCADE"), index=True)
    # one column per metric: ResultColumns, from the registry
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# What one attempt measured: every Result column but its keys and its row timestamp, in the registry's order.
# A metric added to the registry (and its migration) is stored, updated, compared and exported with nothing
# else to change.
RESULT_METRICS: tuple[str, ...] = tuple(k.name for k in METRICS)
# The metrics that are documents or the attempt's own flag, not figures: stored as given, never updated later.
JSON_METRICS: frozenset[str] = frozenset({"simulated"} | {k.name for k in METRICS if not k.scalar})


class StepSample(Base):
    """Per-iteration time (and loss / grad norm for parity) of an attempt's measured window."""

    __tablename__ = "step_sample"
    __table_args__ = (UniqueConstraint("attempt_id", "iteration"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempt.id", ondelete="CASCADE"))
    iteration: Mapped[int]  # index within the measured window
    step_time_s: Mapped[float | None]
    lm_loss: Mapped[float | None]
    grad_norm: Mapped[float | None]


class RankMemory(Base):
    """Per-rank peaks; kept for failed attempts too (an OOM's last peaks are evidence)."""

    __tablename__ = "rank_memory"
    __table_args__ = (UniqueConstraint("attempt_id", "rank"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempt.id", ondelete="CASCADE"))
    rank: Mapped[int]
    pp_stage: Mapped[int | None]
    allocated_mb: Mapped[float | None]
    reserved_mb: Mapped[float | None]
    source: Mapped[str] = mapped_column(String(20), default="log")


class Event(Base):
    """Audit log of decisions: planned, claimed, submitted, retried, promoted, cancelled, lease ..."""

    __tablename__ = "event"
    __table_args__ = (Index("ix_event_sweep_id_id", "sweep_id", "id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweep.id", ondelete="CASCADE"))
    candidate_id: Mapped[int | None] = mapped_column(ForeignKey("candidate.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(30))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Calibration(Base):
    """One fit of the planner's constants against measured results (revision 0002)."""

    __tablename__ = "calibration"
    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweep.id", ondelete="CASCADE"), index=True)
    round: Mapped[int]
    fit: Mapped[dict[str, Any]]
    error: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Parity(Base):
    """A numerical parity check of a candidate against a reference layout (revision 0002)."""

    __tablename__ = "parity"
    id: Mapped[int] = mapped_column(primary_key=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidate.id", ondelete="CASCADE"), index=True)
    reference_key: Mapped[str] = mapped_column(String(64))
    steps: Mapped[int]
    max_loss_diff: Mapped[float | None]
    max_grad_norm_diff: Mapped[float | None]
    tolerance: Mapped[float]
    passed: Mapped[bool]
    detail: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
