"""The one database handle the ledger's parts share: the engine, read and write sessions, row lookups.

The Ledger (sweeps, candidates, attempts, events), its `leases` and its `evidence` each hold this Store (by
composition: one object per job, no mixins), and so do orchestrator.ledger.queries and .export through
`ledger.store`. Sessions never leave orchestrator/ledger/: those parts hand out typed rows. Concurrency model:
- Writes run in `write()`: BEGIN IMMEDIATE on SQLite (one writer at a time, others wait
  busy_timeout), READ COMMITTED plus row locks on PostgreSQL.
- Inserts that two processes may race on (sweep name, candidate key) use INSERT ... ON CONFLICT DO
  NOTHING and then read the winner, so re-running is idempotent and nobody gets an IntegrityError.
- Row locks are always taken candidate first, then attempt, so two writers cannot deadlock.
- Claims use SELECT ... FOR UPDATE SKIP LOCKED on PostgreSQL; on SQLite BEGIN IMMEDIATE already
  serialises them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

from sqlalchemy import Engine, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from orchestrator.ledger import models as m
from orchestrator.ledger.engine import (
    CONNECTION,
    FULL,
    LOCKED,
    NO_SCHEMA,
    failure_kind,
    first_line,
    mask,
    sqlite_path,
    write_engine,
)
from orchestrator.ledger.errors import LedgerError, LedgerStopped
from orchestrator.ledger.watch import FileWatch, lock_holders


class Store:
    """One database engine and its sessions; the Ledger and its parts (leases, evidence) hold one."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._write_engine = write_engine(engine)
        self.dialect = engine.dialect.name
        # the SQLite file this store opened, whatever form its URL takes (None: PostgreSQL)
        self._watch = FileWatch.of(sqlite_path(engine.url)) if self.dialect == "sqlite" else None
        self._revision: str | None = None  # the schema revision the first write saw

    @property
    def url(self) -> str:
        return mask(self.engine.url)

    def close(self) -> None:
        self.engine.dispose()
        if self._watch is not None:  # after the connections: see orchestrator/ledger/watch.py
            self._watch.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._guard(), Session(self.engine, expire_on_commit=False) as s:
            if self._watch is not None:
                self._watch.check()
            yield s

    @contextmanager
    def write(self) -> Iterator[Session]:
        with self._guard():
            with Session(self._write_engine, expire_on_commit=False) as s, s.begin():
                new_id = self._same_ledger(s)
                yield s
            if new_id is not None and self._watch is not None:
                self._watch.adopt(new_id, self.engine)

    def _same_ledger(self, s: Session) -> int | None:
        """Every write transaction first checks that the ledger is still the one this store opened: the same
        SQLite file (deleted, replaced, or overwritten in place, a file under a running sweep would take its
        writes nowhere, or into a stranger's file: orchestrator/ledger/watch.py) and the same schema revision (a
        schema dropped or reset). A LedgerError stops the writer at once, before it writes anything more.
        Returns the ledger id this transaction gives a SQLite ledger that has none yet."""
        if self._watch is not None:
            self._watch.check()
            self._watch.noted_wal()
        # a lock held past the wait or a lost connection fails here first: `_guard` names it (it read "lost its
        # schema" once, inviting a `db upgrade` on a fresh file)
        revision = s.execute(text("SELECT version_num FROM alembic_version")).scalar()
        if self._revision is None:
            self._revision = revision
        elif revision != self._revision:
            raise LedgerError(
                f"the ledger at {self.url} changed schema revision while in use ({self._revision} -> {revision}): "
                "stopping"
            )
        if self._watch is not None and self._watch.ledger_id is None:
            return self._watch.claim_id(s)
        return None

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Driver errors become one LedgerError naming the real cause, password masked: a lock held past the wait
        (who holds it, when it can be told), a lost connection, a full disk (LedgerStopped: the same work goes on
        once the cause is gone), a schema gone, or the driver's own words (a corrupt file). A constraint violation
        stays itself: its caller reads the winner of the race."""
        try:
            yield
        except IntegrityError:
            raise
        except DBAPIError as exc:
            raise self._stopped(exc) from exc

    def _stopped(self, exc: DBAPIError) -> LedgerError:
        kind, detail = failure_kind(exc), first_line(exc, self.engine.url)
        path = self._watch.path if self._watch is not None else None
        if kind == LOCKED and path is not None:
            who = ", ".join(lock_holders(path)) or (
                "another process (a `sqlite3` shell or a backup inside a transaction, another orchestrator)"
            )
            return LedgerStopped(
                f"the ledger {path} is locked: {who} held its write lock longer than ledger.busy_timeout_ms",
                "end that transaction (or that process), or raise ledger.busy_timeout_ms",
            )
        if kind == LOCKED:
            return LedgerStopped(
                f"the ledger at {self.url} is locked: another session held a lock longer than the lock timeout "
                f"({detail})",
                "end that session (pg_stat_activity names it)",
            )
        if kind == CONNECTION:
            return LedgerStopped(
                f"the connection to the ledger at {self.url} was lost ({detail}); nothing of this transaction was "
                "written",
                "once the server answers again (`python -m orchestrator db current` connects)",
            )
        if kind == FULL:
            return LedgerStopped(
                f"no space left for the ledger {path or self.url} ({detail})",
                "free space on its disk (or point ledger.url at another one)",
            )
        if kind == NO_SCHEMA:
            return LedgerError(f"the ledger at {self.url} lost its schema while in use ({detail}): stopping")
        return LedgerError(f"ledger {self.url}: {detail}")

    def insert(self, model: Any) -> Any:
        return (pg_insert if self.dialect == "postgresql" else sqlite_insert)(model)


# ---- lookups inside a session (the parts share them) --------------------------------------------


def find_sweep(s: Session, name: str) -> m.Sweep:
    sweep = s.scalars(select(m.Sweep).where(m.Sweep.name == name)).one_or_none()
    if sweep is None:
        known = s.scalars(select(m.Sweep.name).order_by(m.Sweep.id.desc()).limit(10)).all()
        raise LedgerError(f"no sweep named '{name}' in the ledger" + (f"; recent: {', '.join(known)}" if known else ""))
    return sweep


def find_candidate(s: Session, candidate_id: int, *, lock: bool = False) -> m.Candidate:
    q = select(m.Candidate).where(m.Candidate.id == candidate_id)
    c = s.scalars(q.with_for_update() if lock else q).one_or_none()
    if c is None:
        raise LedgerError(f"no candidate with id {candidate_id}")
    return c


def find_attempt(s: Session, attempt_id: int, *, lock: bool = False) -> m.Attempt:
    q = select(m.Attempt).where(m.Attempt.id == attempt_id)
    a = s.scalars(q.with_for_update() if lock else q).one_or_none()
    if a is None:
        raise LedgerError(f"no attempt with id {attempt_id}")
    return a
