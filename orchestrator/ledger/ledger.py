"""The Ledger the sweep loop, policy and reports call: opening a database, and its sweeps, candidates,
attempts and events. Every method is one short transaction and returns typed dataclass rows, never ORM
objects (they would outlive their session).

Its other jobs are parts it holds, each with the same Store (orchestrator.ledger.store: engine, sessions,
the concurrency model): `ledger.leases` (orchestrator.ledger.leases: who drives a sweep) and
`ledger.evidence` (orchestrator.ledger.evidence: results, samples, calibration, parity). States and statuses
are orchestrator.core.states' enums.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.orm import Session

from orchestrator.core.decision import Decision
from orchestrator.core.knobs import ledger_columns
from orchestrator.core.states import (
    AttemptRole,
    AttemptState,
    CandidateStatus,
    EdgeKind,
    EventKind,
    Fidelity,
    SweepStatus,
)
from orchestrator.ledger import models as m
from orchestrator.ledger.convert import as_datetime, chunks, clean, encode, member, now, to_row
from orchestrator.ledger.engine import make_engine, mask, parse_url, schema_state, sqlite_file, upgrade
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.evidence import Evidence
from orchestrator.ledger.leases import Leases
from orchestrator.ledger.rows import (  # re-exported (__all__): callers import rows from orchestrator.ledger.ledger
    AttemptRow,
    CalibrationRow,
    CandidateIn,
    CandidateRow,
    EventRow,
    MeasuredRow,
    ParityRow,
    SweepRow,
)
from orchestrator.ledger.store import Store, find_attempt, find_candidate, find_sweep

if TYPE_CHECKING:
    from orchestrator.core.schema import LedgerConfig

__all__ = [
    "AttemptRow",
    "CalibrationRow",
    "CandidateIn",
    "CandidateRow",
    "EventRow",
    "Ledger",
    "MeasuredRow",
    "ParityRow",
    "SweepRow",
]
ATTEMPT_FIELDS = frozenset(
    {
        "job_id",
        "array_index",
        "state",
        "submit_time",
        "start_time",
        "end_time",
        "node_list",
        "failure_class",
        "failure_detail",
        "exit_code",
        "log_paths",
        "sidecar_paths",
        "job_dir",
        "simulated",
        "fidelity",  # a launch cut early becomes the screen of what it ran (orchestrator/sweep/cutoff.py)
    }
)


def _candidate_values(sweep_id: int, item: CandidateIn) -> dict[str, Any]:
    lay, pred = item.layout, item.predicted or {}
    verdict = item.verdict if isinstance(item.verdict, str) else (",".join(item.verdict) or "legal")
    return dict(
        sweep_id=sweep_id,
        key=item.key,
        **ledger_columns(lay.to_dict()),
        layer_pattern=item.layer_pattern or pred.get("layer_pattern", "") or "",
        layout=encode(lay),
        pred_step_time_s=pred.get("step_time_s"),
        pred_memory_gb=pred.get("memory_gb"),
        pred_mfu=pred.get("mfu"),
        pred_tokens_per_s=pred.get("tokens_per_s"),
        pred_bubble=pred.get("bubble"),
        d_a=pred.get("d_a"),
        d_e=pred.get("d_e"),
        m=pred.get("m"),
        feasible=pred.get("feasible"),
        predicted=clean(pred),
        decision=encode(item.decision),
        verdict=verdict,
        round=int(item.round),
        edge_kind=None if item.edge_kind is None else member(EdgeKind, item.edge_kind, "edge kind"),
        status=member(CandidateStatus, item.status, "candidate status"),
        created_at=now(),
        updated_at=now(),
    )


class Ledger:
    """One database. Open with `Ledger.open(url)`; use as a context manager or call close(). Leases are
    `ledger.leases`, results and verdicts `ledger.evidence`: parts over the same Store, not base classes."""

    def __init__(self, engine: Engine) -> None:
        self.store = Store(engine)
        self.leases = Leases(self.store)
        self.evidence = Evidence(self.store)

    @property
    def engine(self) -> Engine:
        return self.store.engine

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def dialect(self) -> str:
        return self.store.dialect

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- opening ------------------------------------------------------------------------------

    @classmethod
    def from_config(cls, cfg: LedgerConfig, *, create: bool = False) -> Ledger:
        """The configured ledger (the `ledger` group): the one way the driver and every command open it. Only
        `sweep` and `ledger ingest` create one (`create`): status, resume or cancel of a typo'd URL say so
        instead of leaving an empty ledger behind."""
        return cls.open(
            cfg.url, create=create, create_dir=cfg.create_dir, echo=cfg.echo, busy_timeout_ms=cfg.busy_timeout_ms
        )

    @classmethod
    def open(
        cls,
        url: Any,
        *,
        create: bool = True,
        create_dir: bool = False,
        echo: bool = False,
        busy_timeout_ms: int = 30000,
    ) -> Ledger:
        """Connect, check the schema revision, upgrade a fresh database (or an older SQLite file).

        A missing SQLite file is created only with `create`, and only in an existing folder unless
        `create_dir` (orchestrator.ledger.engine.sqlite_file). A PostgreSQL ledger behind the code is not upgraded
        silently: a team database changes only through `python -m orchestrator db upgrade`.
        """
        parsed = parse_url(url)
        sqlite_file(parsed, create=create, create_dir=create_dir)
        engine = make_engine(parsed, echo=echo, busy_timeout_ms=busy_timeout_ms)
        try:
            state = schema_state(engine)
            if not state.up_to_date:
                if state.fresh and not create:
                    raise LedgerError(f"{mask(parsed)} has no ledger schema; run `python -m orchestrator db upgrade`")
                if not state.fresh and engine.dialect.name != "sqlite":
                    raise LedgerError(
                        f"the ledger at {mask(parsed)} is at schema revision {state.current}, this code needs "
                        f"{state.head}: run `python -m orchestrator db upgrade`"
                    )
                upgrade(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    # ---- sweeps -------------------------------------------------------------------------------

    def create_or_get_sweep(
        self,
        name: str,
        *,
        stage: str,
        config_yaml: str,
        model: str,
        hardware: str,
        workload: str,
        provenance: dict[str, Any],
    ) -> SweepRow:
        """Idempotent: a second call returns the existing sweep; a different stage/model/... is refused."""
        with self.store.write() as s:
            stmt = (
                self.store.insert(m.Sweep)
                .values(
                    name=name,
                    stage=stage,
                    config_yaml=config_yaml,
                    model=model,
                    hardware=hardware,
                    workload=workload,
                    status=SweepStatus.PLANNED,
                    provenance=clean(provenance),
                    created_at=now(),
                    updated_at=now(),
                )
                .on_conflict_do_nothing(index_elements=["name"])
                .returning(m.Sweep.id)
            )
            new_id = s.execute(stmt).scalar_one_or_none()
            sweep = find_sweep(s, name)
            if new_id is not None:
                s.add(
                    m.Event(sweep_id=sweep.id, kind=EventKind.CREATED, message=f"sweep {name} created (stage {stage})")
                )
            else:
                theirs = dict(stage=sweep.stage, model=sweep.model, hardware=sweep.hardware, workload=sweep.workload)
                ours = dict(stage=stage, model=model, hardware=hardware, workload=workload)
                diff = [f"{k}={theirs[k]} (asked {ours[k]})" for k in ours if theirs[k] != ours[k]]
                if diff:
                    raise LedgerError(
                        f"sweep '{name}' already exists with {', '.join(diff)}; choose another sweep.name"
                    )
            return to_row(SweepRow, sweep)

    def get_sweep(self, name: str) -> SweepRow | None:
        with self.store.read() as s:
            sweep = s.scalars(select(m.Sweep).where(m.Sweep.name == name)).one_or_none()
            return None if sweep is None else to_row(SweepRow, sweep)

    def list_sweeps(self) -> list[SweepRow]:
        with self.store.read() as s:
            return [to_row(SweepRow, x) for x in s.scalars(select(m.Sweep).order_by(m.Sweep.id))]

    def set_sweep_status(self, name: str, status: str) -> None:
        status = member(SweepStatus, status, "sweep status")
        with self.store.write() as s:
            sweep = find_sweep(s, name)
            if sweep.status != status:
                s.add(m.Event(sweep_id=sweep.id, kind=EventKind.SWEEP_STATUS, message=f"{sweep.status} -> {status}"))
                sweep.status = status

    def bind_launcher(self, name: str, kind: str) -> str:
        """The launcher kind the sweep's jobs run on (provenance["launcher"]): the first call stores `kind`,
        every later one returns what is stored. A sweep never changes launcher: its stored job ids mean
        nothing to another one (a Slurm id is no local process)."""
        with self.store.write() as s:
            sweep = find_sweep(s, name)
            prov = dict(sweep.provenance or {})
            if not prov.get("launcher"):
                prov["launcher"] = kind
                sweep.provenance = prov
                s.add(m.Event(sweep_id=sweep.id, kind=EventKind.LAUNCHER, message=f"jobs run on {kind}"))
            return str(prov["launcher"])

    def add_provenance(self, name: str, part: str, data: dict[str, Any]) -> None:
        """Set provenance[part] of a sweep (what a later step learned about what it runs with, e.g. the node's
        Megatron commit from preflight), with an event saying so."""
        with self.store.write() as s:
            sweep = find_sweep(s, name)
            sweep.provenance = {**dict(sweep.provenance or {}), part: clean(data)}
            s.add(
                m.Event(sweep_id=sweep.id, kind=EventKind.PROVENANCE, message=f"provenance {part}: {clean(data)}"[:500])
            )

    # ---- candidates ---------------------------------------------------------------------------

    def add_candidates(self, sweep: str, items: Sequence[CandidateIn]) -> list[CandidateRow]:
        """Insert new keys, return every item's row (existing rows are returned, not duplicated)."""
        if not items:
            return []
        with self.store.write() as s:
            return self._add_candidates(s, sweep, items)

    def _add_candidates(self, s: Session, sweep: str, items: Sequence[CandidateIn]) -> list[CandidateRow]:
        sw = find_sweep(s, sweep)
        ids = self._ids_by_key(s, sw.id, [i.key for i in items])
        fresh = {i.key: i for i in items if i.key not in ids}  # later duplicates in `items` collapse
        if fresh:
            stmt = self.store.insert(m.Candidate).on_conflict_do_nothing(index_elements=["sweep_id", "key"])
            inserted = {}
            # the caller's order becomes id order, which claim_for_submission follows within a round
            values = [_candidate_values(sw.id, i) for i in fresh.values()]
            for chunk in chunks(values, 1000):
                for cid, key in s.execute(stmt.returning(m.Candidate.id, m.Candidate.key), list(chunk)):
                    inserted[key] = cid
            ids.update(inserted)
            ids.update(self._ids_by_key(s, sw.id, [k for k in fresh if k not in inserted]))
            parents = self._parent_ids(s, sw.id, [fresh[k] for k in inserted], ids)
            if parents:
                s.execute(update(m.Candidate), [{"id": inserted[k], "parent_id": p} for k, p in parents.items()])
            events = [
                {
                    "sweep_id": sw.id,
                    "candidate_id": cid,
                    "kind": CandidateStatus.PLANNED,  # the event of a status is named by it
                    "created_at": now(),
                    "message": f"round {fresh[k].round}: {fresh[k].status}"
                    + (f" ({fresh[k].edge_kind} {(fresh[k].parent_key or '')[:10]})" if fresh[k].parent_key else ""),
                }
                for k, cid in inserted.items()
            ]
            if events:
                s.execute(insert(m.Event), events)
        order = [ids[i.key] for i in items]
        rows: dict[int, m.Candidate] = {}
        for id_chunk in chunks(order):
            rows.update({c.id: c for c in s.scalars(select(m.Candidate).where(m.Candidate.id.in_(id_chunk)))})
        return [to_row(CandidateRow, rows[cid]) for cid in order]

    @staticmethod
    def _ids_by_key(s: Session, sweep_id: int, keys: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk in chunks(list(dict.fromkeys(keys))):
            q = select(m.Candidate.key, m.Candidate.id).where(
                m.Candidate.sweep_id == sweep_id, m.Candidate.key.in_(chunk)
            )
            out.update(dict(s.execute(q).all()))
        return out

    @staticmethod
    def _parent_ids(s: Session, sweep_id: int, items: Sequence[CandidateIn], ids: dict[str, int]) -> dict[str, int]:
        """parent_key -> id: same sweep first, else any sweep (promoted-from points at the smaller stage)."""
        out: dict[str, int] = {}
        for item in items:
            if not item.parent_key:
                continue
            pid = (
                ids.get(item.parent_key)
                or s.scalars(
                    select(m.Candidate.id)
                    .where(m.Candidate.key == item.parent_key)
                    .order_by(m.Candidate.id.desc())
                    .limit(1)
                ).first()
            )
            if pid is None:
                raise LedgerError(f"candidate {item.key[:10]}: parent {item.parent_key[:10]} is not in the ledger")
            out[item.key] = pid
        return out

    def candidates(
        self, sweep: str, *, status: str | Collection[str] | None = None, round: int | None = None
    ) -> list[CandidateRow]:
        with self.store.read() as s:
            sw = find_sweep(s, sweep)
            q = select(m.Candidate).where(m.Candidate.sweep_id == sw.id)
            if status is not None:
                q = q.where(m.Candidate.status.in_([status] if isinstance(status, str) else list(status)))
            if round is not None:
                q = q.where(m.Candidate.round == round)
            return [to_row(CandidateRow, c) for c in s.scalars(q.order_by(m.Candidate.id))]

    def candidate_by_key(self, sweep: str, key: str) -> CandidateRow | None:
        with self.store.read() as s:
            sw = find_sweep(s, sweep)
            c = s.scalars(
                select(m.Candidate).where(m.Candidate.sweep_id == sw.id, m.Candidate.key == key)
            ).one_or_none()
            return None if c is None else to_row(CandidateRow, c)

    def claim_for_submission(
        self, sweep: str, limit: int, holder: str, *, skip: Collection[int] = ()
    ) -> list[CandidateRow]:
        """Atomically move up to `limit` planned candidates (lowest round first) to claimed, none of `skip`
        (candidates that wait for the sweep's seed: orchestrator/sweep/seeding.py)."""
        with self.store.write() as s:
            sw = find_sweep(s, sweep)
            q = (
                select(m.Candidate)
                .where(m.Candidate.sweep_id == sw.id, m.Candidate.status == CandidateStatus.PLANNED)
                .where(m.Candidate.id.not_in(list(skip)))
                .order_by(m.Candidate.round, m.Candidate.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            claimed = list(s.scalars(q))
            t = now()
            for c in claimed:
                c.status, c.claimed_by, c.updated_at = CandidateStatus.CLAIMED, holder, t
            if claimed:
                s.execute(
                    insert(m.Event),
                    [
                        {
                            "sweep_id": sw.id,
                            "candidate_id": c.id,
                            "kind": EventKind.CLAIMED,
                            "message": f"claimed by {holder}",
                            "created_at": t,
                        }
                        for c in claimed
                    ],
                )
            s.flush()
            return [to_row(CandidateRow, c) for c in claimed]

    def set_candidate_status(self, candidate_id: int, status: str, reason: str | None = None) -> None:
        status = member(CandidateStatus, status, "candidate status")
        with self.store.write() as s:
            self._move(s, find_candidate(s, candidate_id, lock=True), status, reason)

    @staticmethod
    def _move(s: Session, c: m.Candidate, status: str, reason: str | None) -> None:
        """A candidate's status change and the event that records it, inside the caller's transaction."""
        s.add(
            m.Event(
                sweep_id=c.sweep_id,
                candidate_id=c.id,
                kind=EventKind.of_status(status),
                message=f"{c.status} -> {status}" + (f": {reason}" if reason else ""),
            )
        )
        c.status, c.reason, c.updated_at = status, reason, now()

    def requeue(self, candidate_id: int, decision: Decision, reason: str) -> None:
        """A measured candidate back to `planned` with a new decision (e.g. a screened layout confirmed at the
        full window), in one transaction: a resumed loop finds it planned with the decision that explains why."""
        with self.store.write() as s:
            self._requeue(s, candidate_id, decision, reason)

    def redecide(self, candidate_id: int, decision: Decision, reason: str) -> bool:
        """Replace a planned candidate's decision before its launch (the wait for the sweep's seed resolved,
        orchestrator/sweep/seeding.py), with the event that says why; False (and nothing written) when it
        is no longer planned."""
        with self.store.write() as s:
            c = find_candidate(s, candidate_id, lock=True)
            if c.status != CandidateStatus.PLANNED:
                return False
            self._move(s, c, CandidateStatus.PLANNED, reason)
            c.decision = encode(decision)
            return True

    def _requeue(self, s: Session, candidate_id: int, decision: Decision, reason: str) -> None:
        c = find_candidate(s, candidate_id, lock=True)
        self._move(s, c, CandidateStatus.PLANNED, reason)
        c.decision = encode(decision)

    def record_round(
        self,
        sweep: str,
        *,
        requeues: Sequence[tuple[int, Decision, str]],
        items: Sequence[CandidateIn],
        event: tuple[EventKind, str, dict[str, Any]],
        between: Callable[[], None] | None = None,
    ) -> list[CandidateRow]:
        """A round's whole decision in ONE transaction: the screened contenders re-queued at the full window
        (candidate id, decision, reason), the new candidates, and the round's event (kind, message, data). A
        kill or a failed write anywhere in it leaves none of the round, so a resumed loop decides the same
        round again (issue 22: a kill between the re-queue and the new candidates split the round).
        `between` runs after the re-queues, inside the transaction (tests inject a fault there)."""
        with self.store.write() as s:
            for cid, decision, reason in requeues:
                self._requeue(s, cid, decision, reason)
            if between is not None:
                between()
            rows = self._add_candidates(s, sweep, items) if items else []
            kind, message, data = event
            s.add(m.Event(sweep_id=find_sweep(s, sweep).id, kind=kind, message=message, data=clean(data)))
            return rows

    # ---- attempts -----------------------------------------------------------------------------

    def new_attempt(
        self,
        candidate_id: int,
        *,
        job_id: str | None = None,
        array_index: int | None = None,
        job_dir: str,
        simulated: bool,
        launch_token: str | None = None,
        fidelity: Fidelity | str = Fidelity.FULL,
        role: str = AttemptRole.MEASURE,
        attempt_no: int | None = None,
    ) -> AttemptRow:
        """attempt_no = previous + 1 (over every role), decided under the candidate's row lock. Without a job id
        it is a launch intent (written before sbatch, `launch_token` names the job); `launched` then stores the id.
        Only a MEASURE attempt becomes the candidate's latest attempt: a finalist's job is evidence about it.
        `attempt_no`: an attempt rebuilt from its job folder (`ledger ingest`) keeps its folder's number (a
        LedgerError when another attempt of the candidate has it); it is the latest only above every stored one."""
        role = member(AttemptRole, role, "attempt role")
        with self.store.write() as s:
            c = find_candidate(s, candidate_id, lock=True)
            n = s.scalar(select(func.max(m.Attempt.attempt_no)).where(m.Attempt.candidate_id == candidate_id)) or 0
            if attempt_no is not None:
                taken = select(m.Attempt.id).where(
                    m.Attempt.candidate_id == candidate_id, m.Attempt.attempt_no == attempt_no
                )
                if s.scalar(taken) is not None:
                    raise LedgerError(f"candidate {c.key[:10]} already has an attempt {attempt_no}")
            number = n + 1 if attempt_no is None else int(attempt_no)
            a = m.Attempt(
                candidate_id=candidate_id,
                attempt_no=number,
                job_id=None if job_id is None else str(job_id),
                array_index=array_index,
                job_dir=str(job_dir),
                simulated=bool(simulated),
                launch_token=launch_token,
                fidelity=member(Fidelity, fidelity, "fidelity"),
                role=role,
                state=AttemptState.PENDING,
                log_paths=[],
                sidecar_paths=[],
                created_at=now(),
                updated_at=now(),
            )
            s.add(a)
            s.flush()
            if role == AttemptRole.MEASURE and number > n:
                c.latest_attempt_id = a.id
            return to_row(AttemptRow, a)

    def launched(self, jobs: Sequence[tuple[int, str, int | None]], why: str = "job {job_id}") -> None:
        """Intents (attempt id, job id, array index) reached the cluster: job ids and the candidates' `submitted`,
        one transaction for a whole array (all recorded or none). A candidate no longer claimed (`cancel` ran
        meanwhile) keeps its status; the id is kept, so the job can be stopped. A finalist's job (a role other
        than measure) leaves its measured candidate's status alone: its event names the role."""
        with self.store.write() as s:
            for attempt_id, job_id, array_index in jobs:
                a = find_attempt(s, attempt_id)
                c = find_candidate(s, a.candidate_id, lock=True)
                a.job_id, a.array_index, a.submit_time, a.updated_at = str(job_id), array_index, now(), now()
                reason = why.format(job_id=job_id)
                if a.role != AttemptRole.MEASURE:
                    msg = f"{a.role} {reason}"
                    s.add(m.Event(sweep_id=c.sweep_id, candidate_id=c.id, kind=EventKind.LAUNCHED, message=msg))
                    continue
                if c.status != CandidateStatus.CLAIMED:
                    late = f"{reason} (candidate already {c.status})"
                    s.add(m.Event(sweep_id=c.sweep_id, candidate_id=c.id, kind=EventKind.LAUNCHED, message=late))
                    continue
                msg = f"{c.status} -> {CandidateStatus.SUBMITTED}: {reason}"
                s.add(m.Event(sweep_id=c.sweep_id, candidate_id=c.id, kind=EventKind.SUBMITTED, message=msg))
                c.status, c.reason, c.updated_at = CandidateStatus.SUBMITTED, reason, now()

    def update_attempt(self, attempt_id: int, **changes: Any) -> AttemptRow:
        unknown = set(changes) - ATTEMPT_FIELDS
        if unknown:
            raise ValueError(f"update_attempt: unknown fields {sorted(unknown)}; allowed {sorted(ATTEMPT_FIELDS)}")
        with self.store.write() as s:
            a = find_attempt(s, attempt_id)
            for k, v in changes.items():
                if k.endswith("_time"):
                    v = as_datetime(v)
                elif k == "job_id" and v is not None:
                    v = str(v)
                elif k == "state":
                    v = member(AttemptState, v, "attempt state")
                elif k == "fidelity":
                    v = member(Fidelity, v, "fidelity")
                elif k in ("log_paths", "sidecar_paths"):
                    v = [str(p) for p in v or []]
                setattr(a, k, v)
            a.updated_at = now()
            s.flush()
            return to_row(AttemptRow, a)

    def attempts(
        self, candidate_id: int, *, roles: Collection[str] | None = (AttemptRole.MEASURE,)
    ) -> list[AttemptRow]:
        """The candidate's attempts in order: its measurements by default (what retries, the latest outcome and
        the search read), `roles=` the finalists' jobs, `roles=None` every attempt."""
        with self.store.read() as s:
            q = select(m.Attempt).where(m.Attempt.candidate_id == candidate_id)
            if roles is not None:
                q = q.where(m.Attempt.role.in_([member(AttemptRole, r, "attempt role") for r in roles]))
            return [to_row(AttemptRow, a) for a in s.scalars(q.order_by(m.Attempt.attempt_no))]

    def live_attempts(self, sweep: str) -> list[AttemptRow]:
        """Attempts of every role not yet in a terminal Slurm state: what a resumed orchestrator must poll."""
        with self.store.read() as s:
            sw = find_sweep(s, sweep)
            q = (
                select(m.Attempt)
                .join(m.Candidate, m.Candidate.id == m.Attempt.candidate_id)
                .where(m.Candidate.sweep_id == sw.id, m.Attempt.state.not_in(AttemptState.TERMINAL))
                .order_by(m.Attempt.id)
            )
            return [to_row(AttemptRow, a) for a in s.scalars(q)]

    # ---- events -------------------------------------------------------------------------------

    def log_event(
        self,
        sweep: str,
        kind: EventKind,
        message: str,
        *,
        candidate_id: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        with self.store.write() as s:
            sw = find_sweep(s, sweep)
            s.add(
                m.Event(
                    sweep_id=sw.id,
                    candidate_id=candidate_id,
                    kind=kind,
                    message=message,
                    data=None if data is None else clean(data),
                )
            )

    def events(self, sweep: str, *, kind: EventKind | None = None, candidate_id: int | None = None) -> list[EventRow]:
        with self.store.read() as s:
            sw = find_sweep(s, sweep)
            q = select(m.Event).where(m.Event.sweep_id == sw.id)
            if kind is not None:
                q = q.where(m.Event.kind == kind)
            if candidate_id is not None:
                q = q.where(m.Event.candidate_id == candidate_id)
            return [to_row(EventRow, e) for e in s.scalars(q.order_by(m.Event.id))]
