"""The Ledger API the sweep loop, policy and reports call. Every method is one short transaction and
returns typed dataclass rows, never ORM objects (they would outlive their session).

Concurrency model:
- Writes run in `_write()`: BEGIN IMMEDIATE on SQLite (one writer at a time, others wait
  busy_timeout), READ COMMITTED plus row locks on PostgreSQL.
- Inserts that two processes may race on (sweep name, candidate key) use INSERT ... ON CONFLICT DO
  NOTHING and then read the winner, so re-running is idempotent and nobody gets an IntegrityError.
- Row locks are always taken candidate first, then attempt, so two writers cannot deadlock.
- Claims use SELECT ... FOR UPDATE SKIP LOCKED on PostgreSQL; on SQLite BEGIN IMMEDIATE already
  serialises them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from itertools import zip_longest
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from db import models as m
from db.engine import make_engine, mask, parse_url, schema_state, scrub, upgrade, write_engine
from db.errors import LeaseHeld, LedgerError
from db.rows import (  # noqa: F401 - re-exported: callers import rows from db.ledger
    TERMINAL_STATES,
    AttemptRow,
    CalibrationRow,
    CandidateIn,
    CandidateRow,
    EventRow,
    MeasuredRow,
    ParityRow,
    SweepRow,
)

log = logging.getLogger("db")

CANDIDATE_STATUSES = ("planned", "claimed", "submitted", "running", "done", "failed", "cancelled", "excluded")
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
    }
)
RESULT_METRICS = tuple(
    c.name for c in m.Result.__table__.columns if c.name not in ("id", "attempt_id", "candidate_id", "created_at")
)
_CHUNK = 5000  # keys per IN (...) list: below SQLite's variable limit

T = TypeVar("T")


def _row(cls: type[T], obj: Any) -> T:
    return cls(**{f.name: getattr(obj, f.name) for f in fields(cls)})  # type: ignore[arg-type]


def _now() -> datetime:
    return datetime.now(UTC)


def _clean(value: Any) -> Any:
    """JSON-safe copy: tuples to lists, NaN/inf to None (PostgreSQL's json rejects NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _dt(value: Any) -> datetime | None:
    """Accept datetime, ISO text or epoch seconds (sacct and submitit give all three)."""
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _join(modules: Sequence[str] | None) -> str:
    return "+".join(modules or ()) or "none"


def _candidate_values(sweep_id: int, item: CandidateIn) -> dict:
    lay, pred = item.layout, item.predicted or {}
    verdict = item.verdict if isinstance(item.verdict, str) else (",".join(item.verdict) or "legal")
    if item.status not in CANDIDATE_STATUSES:
        raise LedgerError(f"candidate status '{item.status}' is not one of {', '.join(CANDIDATE_STATUSES)}")
    return dict(
        sweep_id=sweep_id,
        key=item.key,
        tp=int(lay.get("tp", 1)),
        pp=int(lay.get("pp", 1)),
        vpp=int(lay.get("vpp", 1)),
        cp=int(lay.get("cp", 1)),
        ep=int(lay.get("ep", 1)),
        etp=int(lay.get("etp", 1)),
        mbs=int(lay.get("mbs", 1)),
        recompute=_join(lay.get("recompute")),
        offload=_join(lay.get("offload")),
        dispatcher=str(lay.get("dispatcher", "alltoall")),
        backend=lay.get("flex_backend"),
        capacity_factor=lay.get("capacity_factor"),
        use_tp_pp_dp_mapping=bool(lay.get("use_tp_pp_dp_mapping", False)),
        layer_pattern=item.layer_pattern or pred.get("layer_pattern", "") or "",
        layout=_clean(lay),
        pred_step_time_s=pred.get("step_time_s"),
        pred_memory_gb=pred.get("memory_gb"),
        pred_mfu=pred.get("mfu"),
        pred_tokens_per_s=pred.get("tokens_per_s"),
        pred_bubble=pred.get("bubble"),
        d_a=pred.get("d_a"),
        d_e=pred.get("d_e"),
        m=pred.get("m"),
        feasible=pred.get("feasible"),
        predicted=_clean(pred),
        verdict=verdict,
        round=int(item.round),
        edge_kind=item.edge_kind,
        status=item.status,
        created_at=_now(),
        updated_at=_now(),
    )


def _chunks(seq: Sequence[T], n: int = _CHUNK) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


class Ledger:
    """One database. Open with `Ledger.open(url)`; use as a context manager or call close()."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._write_engine = write_engine(engine)
        self.dialect = engine.dialect.name

    # ---- opening ------------------------------------------------------------------------------

    @classmethod
    def open(cls, url: Any, *, create: bool = True, echo: bool = False, busy_timeout_ms: int = 30000) -> Ledger:
        """Connect, check the schema revision, upgrade a fresh database (or an older SQLite file).

        A PostgreSQL ledger behind the code is not upgraded silently: a team database changes
        only through `python -m orchestrator db upgrade`.
        """
        parsed = parse_url(url)
        if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
            path = Path(parsed.database)
            if not create and not path.exists():
                raise LedgerError(f"no ledger at {mask(parsed)} (run a sweep or `python -m orchestrator db upgrade`)")
            if create:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise LedgerError(f"cannot create the ledger at {mask(parsed)}: {exc.strerror}") from None
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

    @property
    def url(self) -> str:
        return mask(self.engine.url)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._guard(), Session(self.engine, expire_on_commit=False) as s:
            yield s

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._guard(), Session(self._write_engine, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Driver errors (server gone, disk full, lock timeout) become one LedgerError, password masked."""
        try:
            yield
        except OperationalError as exc:
            detail = scrub(str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc), self.engine.url)
            raise LedgerError(f"ledger {self.url}: {detail}") from exc

    def _insert(self, model):
        return (pg_insert if self.dialect == "postgresql" else sqlite_insert)(model)

    # ---- sweeps -------------------------------------------------------------------------------

    @staticmethod
    def _sweep(s: Session, name: str) -> m.Sweep:
        sweep = s.scalars(select(m.Sweep).where(m.Sweep.name == name)).one_or_none()
        if sweep is None:
            known = s.scalars(select(m.Sweep.name).order_by(m.Sweep.id.desc()).limit(10)).all()
            raise LedgerError(
                f"no sweep named '{name}' in the ledger" + (f"; recent: {', '.join(known)}" if known else "")
            )
        return sweep

    def create_or_get_sweep(
        self, name: str, *, stage: str, config_yaml: str, model: str, hardware: str, workload: str, provenance: dict
    ) -> SweepRow:
        """Idempotent: a second call returns the existing sweep; a different stage/model/... is refused."""
        with self._write() as s:
            stmt = (
                self._insert(m.Sweep)
                .values(
                    name=name,
                    stage=stage,
                    config_yaml=config_yaml,
                    model=model,
                    hardware=hardware,
                    workload=workload,
                    status="planned",
                    provenance=_clean(provenance),
                    created_at=_now(),
                    updated_at=_now(),
                )
                .on_conflict_do_nothing(index_elements=["name"])
                .returning(m.Sweep.id)
            )
            new_id = s.execute(stmt).scalar_one_or_none()
            sweep = self._sweep(s, name)
            if new_id is not None:
                s.add(m.Event(sweep_id=sweep.id, kind="created", message=f"sweep {name} created (stage {stage})"))
            else:
                theirs = dict(stage=sweep.stage, model=sweep.model, hardware=sweep.hardware, workload=sweep.workload)
                ours = dict(stage=stage, model=model, hardware=hardware, workload=workload)
                diff = [f"{k}={theirs[k]} (asked {ours[k]})" for k in ours if theirs[k] != ours[k]]
                if diff:
                    raise LedgerError(
                        f"sweep '{name}' already exists with {', '.join(diff)}; choose another sweep.name"
                    )
            return _row(SweepRow, sweep)

    def get_sweep(self, name: str) -> SweepRow | None:
        with self.read() as s:
            sweep = s.scalars(select(m.Sweep).where(m.Sweep.name == name)).one_or_none()
            return None if sweep is None else _row(SweepRow, sweep)

    def list_sweeps(self) -> list[SweepRow]:
        with self.read() as s:
            return [_row(SweepRow, x) for x in s.scalars(select(m.Sweep).order_by(m.Sweep.id))]

    def set_sweep_status(self, name: str, status: str) -> None:
        with self._write() as s:
            sweep = self._sweep(s, name)
            if sweep.status != status:
                s.add(m.Event(sweep_id=sweep.id, kind="sweep-status", message=f"{sweep.status} -> {status}"))
                sweep.status = status

    # ---- leases -------------------------------------------------------------------------------

    def acquire_lease(self, sweep: str, holder: str, ttl_s: float) -> None:
        """Take (or renew) the sweep's lease in one transaction; a stale lease is taken over, logged."""
        for _ in range(3):
            try:
                with self._write() as s:
                    sw = self._sweep(s, sweep)
                    now = _now()
                    lease = s.scalars(select(m.Lease).where(m.Lease.sweep_id == sw.id).with_for_update()).one_or_none()
                    if lease is None:
                        s.add(
                            m.Lease(
                                sweep_id=sw.id,
                                holder=holder,
                                acquired_at=now,
                                heartbeat_at=now,
                                expires_at=now + timedelta(seconds=ttl_s),
                            )
                        )
                        s.add(m.Event(sweep_id=sw.id, kind="lease", message=f"lease taken by {holder}"))
                    elif lease.holder == holder:
                        lease.heartbeat_at, lease.expires_at = now, now + timedelta(seconds=ttl_s)
                    elif lease.expires_at <= now:
                        msg = (
                            f"stale lease of {lease.holder} (expired {lease.expires_at:%H:%M:%S}) "
                            f"taken over by {holder}"
                        )
                        log.warning("sweep %s: %s", sweep, msg)
                        s.add(
                            m.Event(sweep_id=sw.id, kind="lease", message=msg, data={"previous_holder": lease.holder})
                        )
                        lease.holder, lease.acquired_at, lease.heartbeat_at = holder, now, now
                        lease.expires_at = now + timedelta(seconds=ttl_s)
                    else:
                        raise LeaseHeld(sweep, lease.holder, lease.expires_at)
                return
            except IntegrityError:  # another process inserted the first lease row: read it again
                continue
        raise LedgerError(f"could not take the lease of sweep '{sweep}' (contention)")

    def heartbeat(self, sweep: str, holder: str, ttl_s: float | None = None) -> None:
        """Extend our lease by its TTL; LeaseHeld if someone took it over (we must stop driving)."""
        with self._write() as s:
            sw = self._sweep(s, sweep)
            lease = s.scalars(select(m.Lease).where(m.Lease.sweep_id == sw.id).with_for_update()).one_or_none()
            if lease is None or lease.holder != holder:
                if lease is not None:
                    raise LeaseHeld(sweep, lease.holder, lease.expires_at)
                raise LedgerError(f"{holder} holds no lease on sweep '{sweep}'")
            ttl = ttl_s if ttl_s is not None else (lease.expires_at - lease.heartbeat_at).total_seconds()
            now = _now()
            lease.heartbeat_at, lease.expires_at = now, now + timedelta(seconds=ttl)

    def release_lease(self, sweep: str, holder: str) -> None:
        with self._write() as s:
            sw = self._sweep(s, sweep)
            gone = s.execute(delete(m.Lease).where(m.Lease.sweep_id == sw.id, m.Lease.holder == holder)).rowcount
            if gone:
                s.add(m.Event(sweep_id=sw.id, kind="lease", message=f"lease released by {holder}"))

    # ---- candidates ---------------------------------------------------------------------------

    def add_candidates(self, sweep: str, items: Sequence[CandidateIn]) -> list[CandidateRow]:
        """Insert new keys, return every item's row (existing rows are returned, not duplicated)."""
        if not items:
            return []
        with self._write() as s:
            sw = self._sweep(s, sweep)
            ids = self._ids_by_key(s, sw.id, [i.key for i in items])
            fresh = {i.key: i for i in items if i.key not in ids}  # later duplicates in `items` collapse
            if fresh:
                stmt = self._insert(m.Candidate).on_conflict_do_nothing(index_elements=["sweep_id", "key"])
                inserted = {}
                # the caller's order becomes id order, which claim_for_submission follows within a round
                values = [_candidate_values(sw.id, i) for i in fresh.values()]
                for chunk in _chunks(values, 1000):
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
                        "kind": "planned",
                        "created_at": _now(),
                        "message": f"round {fresh[k].round}: {fresh[k].status}"
                        + (f" ({fresh[k].edge_kind} {fresh[k].parent_key[:10]})" if fresh[k].parent_key else ""),
                    }
                    for k, cid in inserted.items()
                ]
                if events:
                    s.execute(insert(m.Event), events)
            order = [ids[i.key] for i in items]
            rows = {}
            for chunk in _chunks(order):
                rows.update({c.id: c for c in s.scalars(select(m.Candidate).where(m.Candidate.id.in_(chunk)))})
            return [_row(CandidateRow, rows[cid]) for cid in order]

    @staticmethod
    def _ids_by_key(s: Session, sweep_id: int, keys: Sequence[str]) -> dict:
        out = {}
        for chunk in _chunks(list(dict.fromkeys(keys))):
            q = select(m.Candidate.key, m.Candidate.id).where(
                m.Candidate.sweep_id == sweep_id, m.Candidate.key.in_(chunk)
            )
            out.update(dict(s.execute(q).all()))
        return out

    @staticmethod
    def _parent_ids(s: Session, sweep_id: int, items: Sequence[CandidateIn], ids: dict) -> dict:
        """parent_key -> id: same sweep first, else any sweep (promoted-from points at the smaller stage)."""
        out = {}
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
        self, sweep: str, *, status: str | Sequence[str] | None = None, round: int | None = None
    ) -> list[CandidateRow]:
        with self.read() as s:
            sw = self._sweep(s, sweep)
            q = select(m.Candidate).where(m.Candidate.sweep_id == sw.id)
            if status is not None:
                q = q.where(m.Candidate.status.in_([status] if isinstance(status, str) else list(status)))
            if round is not None:
                q = q.where(m.Candidate.round == round)
            return [_row(CandidateRow, c) for c in s.scalars(q.order_by(m.Candidate.id))]

    def candidate_by_key(self, sweep: str, key: str) -> CandidateRow | None:
        with self.read() as s:
            sw = self._sweep(s, sweep)
            c = s.scalars(
                select(m.Candidate).where(m.Candidate.sweep_id == sw.id, m.Candidate.key == key)
            ).one_or_none()
            return None if c is None else _row(CandidateRow, c)

    def claim_for_submission(self, sweep: str, limit: int, holder: str) -> list[CandidateRow]:
        """Atomically move up to `limit` planned candidates (lowest round first) to claimed."""
        with self._write() as s:
            sw = self._sweep(s, sweep)
            q = (
                select(m.Candidate)
                .where(m.Candidate.sweep_id == sw.id, m.Candidate.status == "planned")
                .order_by(m.Candidate.round, m.Candidate.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            claimed = list(s.scalars(q))
            now = _now()
            for c in claimed:
                c.status, c.claimed_by, c.updated_at = "claimed", holder, now
            if claimed:
                s.execute(
                    insert(m.Event),
                    [
                        {
                            "sweep_id": sw.id,
                            "candidate_id": c.id,
                            "kind": "claimed",
                            "message": f"claimed by {holder}",
                            "created_at": now,
                        }
                        for c in claimed
                    ],
                )
            s.flush()
            return [_row(CandidateRow, c) for c in claimed]

    def set_candidate_status(self, candidate_id: int, status: str, reason: str | None = None) -> None:
        if status not in CANDIDATE_STATUSES:
            raise LedgerError(f"candidate status '{status}' is not one of {', '.join(CANDIDATE_STATUSES)}")
        with self._write() as s:
            c = self._candidate(s, candidate_id, lock=True)
            s.add(
                m.Event(
                    sweep_id=c.sweep_id,
                    candidate_id=c.id,
                    kind=status,
                    message=f"{c.status} -> {status}" + (f": {reason}" if reason else ""),
                )
            )
            c.status, c.reason, c.updated_at = status, reason, _now()

    @staticmethod
    def _candidate(s: Session, candidate_id: int, *, lock: bool = False) -> m.Candidate:
        q = select(m.Candidate).where(m.Candidate.id == candidate_id)
        c = s.scalars(q.with_for_update() if lock else q).one_or_none()
        if c is None:
            raise LedgerError(f"no candidate with id {candidate_id}")
        return c

    # ---- attempts -----------------------------------------------------------------------------

    def new_attempt(
        self,
        candidate_id: int,
        *,
        job_id: str | None = None,
        array_index: int | None = None,
        job_dir: str,
        simulated: bool,
    ) -> AttemptRow:
        """attempt_no = previous + 1, decided under the candidate's row lock."""
        with self._write() as s:
            c = self._candidate(s, candidate_id, lock=True)
            n = s.scalar(select(func.max(m.Attempt.attempt_no)).where(m.Attempt.candidate_id == candidate_id)) or 0
            a = m.Attempt(
                candidate_id=candidate_id,
                attempt_no=n + 1,
                job_id=None if job_id is None else str(job_id),
                array_index=array_index,
                job_dir=str(job_dir),
                simulated=bool(simulated),
                state="PENDING",
                log_paths=[],
                sidecar_paths=[],
                created_at=_now(),
                updated_at=_now(),
            )
            s.add(a)
            s.flush()
            c.latest_attempt_id = a.id
            return _row(AttemptRow, a)

    def update_attempt(self, attempt_id: int, **changes: Any) -> AttemptRow:
        unknown = set(changes) - ATTEMPT_FIELDS
        if unknown:
            raise ValueError(f"update_attempt: unknown fields {sorted(unknown)}; allowed {sorted(ATTEMPT_FIELDS)}")
        with self._write() as s:
            a = self._attempt(s, attempt_id)
            for k, v in changes.items():
                if k.endswith("_time"):
                    v = _dt(v)
                elif k == "job_id" and v is not None:
                    v = str(v)
                elif k in ("log_paths", "sidecar_paths"):
                    v = [str(p) for p in v or []]
                setattr(a, k, v)
            a.updated_at = _now()
            s.flush()
            return _row(AttemptRow, a)

    @staticmethod
    def _attempt(s: Session, attempt_id: int, *, lock: bool = False) -> m.Attempt:
        q = select(m.Attempt).where(m.Attempt.id == attempt_id)
        a = s.scalars(q.with_for_update() if lock else q).one_or_none()
        if a is None:
            raise LedgerError(f"no attempt with id {attempt_id}")
        return a

    def attempts(self, candidate_id: int) -> list[AttemptRow]:
        with self.read() as s:
            q = select(m.Attempt).where(m.Attempt.candidate_id == candidate_id).order_by(m.Attempt.attempt_no)
            return [_row(AttemptRow, a) for a in s.scalars(q)]

    def live_attempts(self, sweep: str) -> list[AttemptRow]:
        """Attempts not yet in a terminal Slurm state: what a resumed orchestrator must poll."""
        with self.read() as s:
            sw = self._sweep(s, sweep)
            q = (
                select(m.Attempt)
                .join(m.Candidate, m.Candidate.id == m.Attempt.candidate_id)
                .where(m.Candidate.sweep_id == sw.id, m.Attempt.state.not_in(TERMINAL_STATES))
                .order_by(m.Attempt.id)
            )
            return [_row(AttemptRow, a) for a in s.scalars(q)]

    # ---- results ------------------------------------------------------------------------------

    def record_result(self, attempt_id: int, result: dict) -> None:
        """Store a JobResult dict: result row (if ok), step samples and rank memory, in ONE transaction.

        Idempotent per attempt: a second call for the same attempt changes nothing.
        """
        with self._write() as s:
            cand_id = self._attempt(s, attempt_id).candidate_id
            c = self._candidate(s, cand_id, lock=True)  # lock order: candidate, then attempt
            a = self._attempt(s, attempt_id, lock=True)
            seen = s.scalar(select(func.count()).select_from(m.StepSample).where(m.StepSample.attempt_id == attempt_id))
            seen = seen or s.scalar(
                select(func.count()).select_from(m.RankMemory).where(m.RankMemory.attempt_id == attempt_id)
            )
            if seen or s.scalar(select(m.Result.id).where(m.Result.attempt_id == attempt_id)) is not None:
                return
            ok = bool(result.get("ok"))
            a.simulated = bool(result.get("simulated", a.simulated))
            for k in ("failure_class", "failure_detail", "exit_code"):  # keep what sacct already told us
                if result.get(k) not in (None, ""):
                    setattr(a, k, result[k])
            if a.state not in TERMINAL_STATES:
                a.state = result.get("slurm_state") or ("COMPLETED" if ok else "FAILED")
            if result.get("log_paths"):
                a.log_paths = [str(p) for p in result["log_paths"]]
            if result.get("sidecar_paths"):
                a.sidecar_paths = [str(p) for p in result["sidecar_paths"]]
            a.updated_at = _now()
            if ok:
                values = {k: result[k] for k in RESULT_METRICS if k in result and result[k] is not None}
                values.update(
                    timers_ms=_clean(result.get("timers_ms") or {}), versions=_clean(result.get("versions") or {})
                )
                r = m.Result(
                    attempt_id=attempt_id,
                    candidate_id=cand_id,
                    simulated=a.simulated,
                    **{k: v for k, v in values.items() if k != "simulated"},
                )
                s.add(r)
                s.flush()
                c.latest_result_id = r.id
            samples = [
                {"attempt_id": attempt_id, "iteration": i, "step_time_s": t, "lm_loss": loss, "grad_norm": g}
                for i, (t, loss, g) in enumerate(
                    zip_longest(
                        result.get("step_times_s") or [], result.get("lm_loss") or [], result.get("grad_norm") or []
                    )
                )
            ]
            if samples:
                s.execute(insert(m.StepSample), samples)
            ranks = [
                {
                    "attempt_id": attempt_id,
                    "rank": r["rank"],
                    "pp_stage": r.get("pp_stage"),
                    "allocated_mb": r.get("allocated_mb"),
                    "reserved_mb": r.get("reserved_mb"),
                    "source": r.get("source", "log"),
                }
                for r in result.get("rank_memory") or []
            ]
            if ranks:
                s.execute(insert(m.RankMemory), ranks)

    def result(self, attempt_id: int) -> dict | None:
        """The stored metrics of one attempt (RESULT_METRICS), or None when it did not succeed."""
        with self.read() as s:
            r = s.scalars(select(m.Result).where(m.Result.attempt_id == attempt_id)).one_or_none()
            return None if r is None else {k: getattr(r, k) for k in RESULT_METRICS}

    def update_result_metrics(self, attempt_id: int, **metrics: Any) -> dict:
        """Set result columns of one attempt's stored result (a later measurement about the same run, e.g.
        a finalist's long-run window: ckpt_save_s, q_effective ...). Unknown names and a missing result row
        are LedgerErrors. Returns the row's metrics after the update."""
        unknown = set(metrics) - set(RESULT_METRICS) or set(metrics) & {"simulated", "timers_ms", "versions"}
        if unknown:
            raise LedgerError(f"update_result_metrics: not updatable {sorted(unknown)}")
        with self._write() as s:
            r = s.scalars(select(m.Result).where(m.Result.attempt_id == attempt_id).with_for_update()).one_or_none()
            if r is None:
                raise LedgerError(f"attempt {attempt_id} has no stored result to update")
            for k, v in metrics.items():
                setattr(r, k, _clean(v))
            s.flush()
            return {k: getattr(r, k) for k in RESULT_METRICS}

    def step_samples(self, attempt_id: int) -> list[tuple]:
        """(iteration, step_time_s, lm_loss, grad_norm) of the measured window, in order."""
        with self.read() as s:
            q = (
                select(m.StepSample.iteration, m.StepSample.step_time_s, m.StepSample.lm_loss, m.StepSample.grad_norm)
                .where(m.StepSample.attempt_id == attempt_id)
                .order_by(m.StepSample.iteration)
            )
            return [tuple(r) for r in s.execute(q)]

    def rank_memory(self, attempt_id: int) -> list[dict]:
        with self.read() as s:
            q = select(m.RankMemory).where(m.RankMemory.attempt_id == attempt_id).order_by(m.RankMemory.rank)
            return [
                {
                    "rank": r.rank,
                    "pp_stage": r.pp_stage,
                    "allocated_mb": r.allocated_mb,
                    "reserved_mb": r.reserved_mb,
                    "source": r.source,
                }
                for r in s.scalars(q)
            ]

    def measured(
        self, sweep: str | None = None, stage: str | None = None, model: str | None = None
    ) -> list[MeasuredRow]:
        """Every candidate with a successful result, joined with its layout and predictions."""
        with self.read() as s:
            q = (
                select(m.Sweep, m.Candidate, m.Attempt, m.Result)
                .join(m.Candidate, m.Candidate.sweep_id == m.Sweep.id)
                .join(m.Result, m.Result.id == m.Candidate.latest_result_id)
                .join(m.Attempt, m.Attempt.id == m.Result.attempt_id)
            )
            if sweep is not None:
                q = q.where(m.Sweep.name == sweep)
            if stage is not None:
                q = q.where(m.Sweep.stage == stage)
            if model is not None:
                q = q.where(m.Sweep.model == model)
            out = []
            for sw, c, a, r in s.execute(q.order_by(m.Candidate.id)):
                out.append(
                    MeasuredRow(
                        sweep=sw.name,
                        stage=sw.stage,
                        model=sw.model,
                        hardware=sw.hardware,
                        candidate_id=c.id,
                        key=c.key,
                        round=c.round,
                        status=c.status,
                        layout=c.layout,
                        layer_pattern=c.layer_pattern,
                        predicted=c.predicted,
                        verdict=c.verdict,
                        attempt_id=a.id,
                        attempt_no=a.attempt_no,
                        job_id=a.job_id,
                        simulated=r.simulated,
                        partial=r.partial,
                        metrics={k: getattr(r, k) for k in RESULT_METRICS},
                    )
                )
            return out

    # ---- events, calibration, parity ----------------------------------------------------------

    def log_event(
        self, sweep: str, kind: str, message: str, *, candidate_id: int | None = None, data: dict | None = None
    ) -> None:
        with self._write() as s:
            sw = self._sweep(s, sweep)
            s.add(
                m.Event(
                    sweep_id=sw.id,
                    candidate_id=candidate_id,
                    kind=kind,
                    message=message,
                    data=None if data is None else _clean(data),
                )
            )

    def events(self, sweep: str, *, kind: str | None = None, candidate_id: int | None = None) -> list[EventRow]:
        with self.read() as s:
            sw = self._sweep(s, sweep)
            q = select(m.Event).where(m.Event.sweep_id == sw.id)
            if kind is not None:
                q = q.where(m.Event.kind == kind)
            if candidate_id is not None:
                q = q.where(m.Event.candidate_id == candidate_id)
            return [_row(EventRow, e) for e in s.scalars(q.order_by(m.Event.id))]

    def record_calibration(self, sweep: str, round: int, fit: dict, error: dict) -> CalibrationRow:
        with self._write() as s:
            sw = self._sweep(s, sweep)
            cal = m.Calibration(sweep_id=sw.id, round=round, fit=_clean(fit), error=_clean(error), created_at=_now())
            s.add(cal)
            s.flush()
            return _row(CalibrationRow, cal)

    def calibrations(self, sweep: str) -> list[CalibrationRow]:
        with self.read() as s:
            sw = self._sweep(s, sweep)
            q = select(m.Calibration).where(m.Calibration.sweep_id == sw.id).order_by(m.Calibration.id)
            return [_row(CalibrationRow, c) for c in s.scalars(q)]

    def record_parity(
        self,
        candidate_id: int,
        *,
        reference_key: str,
        steps: int,
        max_loss_diff: float | None,
        max_grad_norm_diff: float | None,
        tolerance: float,
        passed: bool,
        detail: str = "",
    ) -> ParityRow:
        """A failing parity row excludes the candidate from `best`."""
        with self._write() as s:
            c = self._candidate(s, candidate_id)
            p = m.Parity(
                candidate_id=candidate_id,
                reference_key=reference_key,
                steps=steps,
                max_loss_diff=max_loss_diff,
                max_grad_norm_diff=max_grad_norm_diff,
                tolerance=tolerance,
                passed=bool(passed),
                detail=detail,
                created_at=_now(),
            )
            s.add(p)
            s.add(
                m.Event(
                    sweep_id=c.sweep_id,
                    candidate_id=c.id,
                    kind="parity",
                    message=f"parity vs {reference_key[:10]}: {'passed' if passed else 'FAILED'} {detail}".strip(),
                )
            )
            s.flush()
            return _row(ParityRow, p)

    def parity(self, candidate_id: int) -> list[ParityRow]:
        with self.read() as s:
            q = select(m.Parity).where(m.Parity.candidate_id == candidate_id).order_by(m.Parity.id)
            return [_row(ParityRow, p) for p in s.scalars(q)]
