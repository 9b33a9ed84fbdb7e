"""The state vocabularies: an attempt's Slurm state and role, a candidate's and a sweep's status, a lineage edge,
a fidelity.

One owner for each word. The ledger stores these strings, launch/ reads Slurm's and the sweep loop moves
candidates between statuses; each imports the enum from here. StrEnum: a member IS its string, so the
values stored before these enums existed still compare equal (no data migration) and JSON/SQL see text.
Stdlib only: orchestrator/ledger/, launch/ and jobs/ (compute nodes, bare Python) import it.

Each enum names its groups (TERMINAL, LIVE, ...) as frozensets of members, attached after the class
body (inside it they would become members).
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class AttemptState(StrEnum):
    """Slurm's own job-state words (sacct and squeue), plus UNKNOWN for "no answer yet".

    An attempt row exists only once sbatch returned its job id, so its first state is PENDING.
    """

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    RESIZING = "RESIZING"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    PREEMPTED = "PREEMPTED"  # final: jobs go out with --no-requeue, so the sweep (not Slurm) reruns it
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    SPECIAL_EXIT = "SPECIAL_EXIT"  # requeued and held: a user may still release it
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"  # a federated sibling removed because another cluster started the job
    UNKNOWN = "UNKNOWN"  # ours: sacct does not list the job yet, or the query failed

    TERMINAL: ClassVar[frozenset[AttemptState]]
    LIVE: ClassVar[frozenset[AttemptState]]

    @classmethod
    def parse(cls, text: str | None) -> AttemptState:
        """sacct's State field -> a member: "CANCELLED by 0" is CANCELLED, a word Slurm adds later UNKNOWN."""
        words = (text or "").split()
        word = words[0].rstrip("+").upper() if words else ""
        return cls.__members__.get(word, cls.UNKNOWN)

    @property
    def terminal(self) -> bool:
        """The job will not change by itself any more (the loop stops polling it)."""
        return self in AttemptState.TERMINAL


AttemptState.TERMINAL = frozenset(
    {
        AttemptState.COMPLETED,
        AttemptState.FAILED,
        AttemptState.CANCELLED,
        AttemptState.TIMEOUT,
        AttemptState.NODE_FAIL,
        AttemptState.PREEMPTED,
        AttemptState.OUT_OF_MEMORY,
        AttemptState.BOOT_FAIL,
        AttemptState.DEADLINE,
        AttemptState.REVOKED,
    }
)
AttemptState.LIVE = frozenset(AttemptState) - AttemptState.TERMINAL


class CandidateStatus(StrEnum):
    """Where a candidate is in the sweep: planned -> claimed -> submitted -> running -> done | failed ..."""

    PLANNED = "planned"  # in the ledger, waiting for a driver to claim it (also: a retry decided)
    CLAIMED = "claimed"  # taken by one driver; sbatch not yet returned
    SUBMITTED = "submitted"  # its latest attempt has a job id
    RUNNING = "running"
    DONE = "done"  # measured
    FAILED = "failed"  # not retried (deterministic, or out of attempts)
    CANCELLED = "cancelled"
    EXCLUDED = "excluded"  # measured, then failed the correctness gate: never a best, parent or promoted

    QUEUED: ClassVar[frozenset[CandidateStatus]]
    IN_FLIGHT: ClassVar[frozenset[CandidateStatus]]
    LIVE: ClassVar[frozenset[CandidateStatus]]
    TERMINAL: ClassVar[frozenset[CandidateStatus]]


# Not running yet (the live view's "queued").
CandidateStatus.QUEUED = frozenset({CandidateStatus.PLANNED, CandidateStatus.CLAIMED, CandidateStatus.SUBMITTED})
# Taken by a driver: what a resumed driver reconciles (re-attach, settle, or release the claim).
CandidateStatus.IN_FLIGHT = frozenset({CandidateStatus.CLAIMED, CandidateStatus.SUBMITTED, CandidateStatus.RUNNING})
# Not settled: the round is not over while any candidate is live; `cancel` cancels these.
CandidateStatus.LIVE = CandidateStatus.IN_FLIGHT | {CandidateStatus.PLANNED}
CandidateStatus.TERMINAL = frozenset(CandidateStatus) - CandidateStatus.LIVE


class SweepStatus(StrEnum):
    PLANNED = "planned"  # created, never driven
    RUNNING = "running"  # a driver holds (or held, until it was killed) the lease
    DONE = "done"  # the search stopped (budget, rounds, convergence, nothing left)
    INTERRUPTED = "interrupted"  # the driver stopped (Ctrl-C, error, wall limit); `resume` continues
    CANCELLED = "cancelled"  # `orchestrator cancel`


class EdgeKind(StrEnum):
    """Why a candidate has a parent (candidate.parent_id)."""

    NEIGHBOUR = "neighbour"  # a one-knob neighbour of a measured layout of the same sweep
    JOINT = "joint"  # a two-knob move over coupled knobs (orchestrator/search/moves.py COUPLED)
    PROMOTED_FROM = "promoted-from"  # promoted from a measured layout of the stage this one promotes from


class Fidelity(StrEnum):
    """How long an attempt measures (issue 12 item 4): the windows of each live in orchestrator/schedule/fidelity.

    PROBE: start-up plus a few iterations, read for the max-reserved memory line (does it fit?); SCREEN: a short
    measured window that ranks many candidates; FULL: the stage's window, the only one a best is decided on."""

    PROBE = "probe"
    SCREEN = "screen"
    FULL = "full"


class AttemptRole(StrEnum):
    """What an attempt's job is for (attempt.role, revision 0009). Every job the sweep launches is an attempt
    of one candidate, launched, adopted, polled, collected and retried by the one driver path.

    MEASURE: the search's measurement of the candidate, at its fidelity (probe, screen or full): the only role
    whose result is the candidate's measurement (latest result, the best, calibration, noise). The finalists'
    jobs (orchestrator/sweep/finalists.py) run after the search: PARITY (the candidate, `parity.steps` from the
    sweep's seed) and PARITY_REFERENCE (its reference layout, same seed and steps), whose curves decide the
    correctness gate; LONG_RUN_SAVE (train to X, save, exit) and LONG_RUN_RESTORE (load X, train on), whose
    checkpoint timers give Q_effective. Their results are evidence about the candidate, never its measurement."""

    MEASURE = "measure"
    PARITY = "parity"
    PARITY_REFERENCE = "parity-reference"
    LONG_RUN_SAVE = "long-run-save"
    LONG_RUN_RESTORE = "long-run-restore"

    FINALIST: ClassVar[frozenset[AttemptRole]]


AttemptRole.FINALIST = frozenset(AttemptRole) - {AttemptRole.MEASURE}


class EventKind(StrEnum):
    """Every kind of row the ledger's event table stores (event.kind): one word per event, owned here, so a
    reader filters by a member and a new event is a new member, never a string typed in two modules.

    A candidate's status change is logged under its new status (`of_status`): those members carry
    CandidateStatus's words. A test may log a word of its own (`Ledger.log_event` takes any str)."""

    # the sweep's own life (orchestrator/ledger/ledger.py)
    CREATED = "created"  # the sweep row was made
    SWEEP_STATUS = "sweep-status"  # planned -> running -> done | interrupted | cancelled
    LAUNCHER = "launcher"  # the backend kind the sweep is bound to (Ledger.bind_launcher)
    PROVENANCE = "provenance"  # a provenance part recorded
    LEASE = "lease"  # taken, taken over, released (orchestrator/ledger/leases.py)
    DRIVER = "driver"  # which holder drives the sweep, on which launcher
    STOP = "stop"  # why the search stopped (the report's stop reason)
    ROUND = "round"  # one round's decision: keys, reasons, fidelities, confirms, step_cv
    PROMOTES_FROM = "promotes-from"  # data.sweep_id: the sweep this one promotes from
    PREFLIGHT = "preflight"  # the node preflight's verdict (or its skipping); data.rejected are never launched
    CAPACITY = "capacity"  # once per GPU capacity the sweep now plans with (data.attempt_id)
    INGESTED = "ingested"  # rows rebuilt from job folders (`ledger ingest`)
    # a candidate's life
    PLANNED = "planned"
    CLAIMED = "claimed"
    SUBMITTED = "submitted"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # also the sweep's: `orchestrator cancel`
    EXCLUDED = "excluded"
    LAUNCHED = "launched"  # a job id reached a candidate no longer claimed, or a finalist's job
    RETRY = "retry"  # a failed attempt retried (or not), and why
    CUT = "cut"  # an early cut: the median and the line (data: job id, the line)
    PARITY = "parity"  # a parity verdict
    # the finalists (orchestrator/sweep/finalists.py)
    FINALISTS = "finalists"  # the pick: keys in order, measured_through
    LONG_RUN = "long-run"  # one per finalist: its long-run figures, or why there are none
    FINALIST_COST = "finalist-cost"  # before revision 0009: one per finalist job, data.gpu_hours

    @classmethod
    def of_status(cls, status: str) -> EventKind:
        """The event kind a candidate's move to `status` is logged under."""
        return cls(CandidateStatus(status).value)
