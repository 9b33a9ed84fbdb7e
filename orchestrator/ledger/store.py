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

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

from sqlalchemy import Engine, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DatabaseError, DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from orchestrator.ledger import models as m
from orchestrator.ledger.engine import mask, scrub, sqlite_path, write_engine
from orchestrator.ledger.errors import LedgerError


class Store:
    """One database engine and its sessions; the Ledger and its parts (leases, evidence) hold one."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._write_engine = write_engine(engine)
        self.dialect = engine.dialect.name
        self._file = _file_identity(engine)  # the SQLite file this store opened: (path, (device, inode))
        self._revision: str | None = None  # the schema revision the first write saw
        self._wal: tuple[int, int] | None = None  # the (device, inode) of its -wal file at the last write

    @property
    def url(self) -> str:
        return mask(self.engine.url)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._guard(), Session(self.engine, expire_on_commit=False) as s:
            yield s

    @contextmanager
    def write(self) -> Iterator[Session]:
        with self._guard(), Session(self._write_engine, expire_on_commit=False) as s, s.begin():
            self._same_ledger(s)
            yield s

    def _same_ledger(self, s: Session) -> None:
        """Every write transaction first checks that the ledger is still the one this store opened: the same
        SQLite file (a file deleted or replaced under a running sweep would take its writes nowhere, or into
        a stranger's file) and the same schema revision (a schema dropped or reset). A LedgerError stops the
        writer at once, before it writes anything more."""
        if self._file is not None:
            path, opened = self._file
            now = _identity(path)
            if now != opened:
                self._drop_stale_wal(path)
                what = "deleted" if now is None else "replaced by another file"
                raise LedgerError(f"the ledger file {path} was {what} while this process used it: stopping")
            self._wal = _identity(path + "-wal")
        try:
            revision = s.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except DBAPIError:
            raise LedgerError(f"the ledger at {self.url} lost its schema while in use: stopping") from None
        if self._revision is None:
            self._revision = revision
        elif revision != self._revision:
            raise LedgerError(
                f"the ledger at {self.url} changed schema revision while in use ({self._revision} -> {revision}): "
                "stopping"
            )

    def _drop_stale_wal(self, path: str) -> None:
        """Our write-ahead log, left beside a file that is no longer ours: SQLite would replay its frames into
        whatever file is opened at `path` next (the replacement, or a new ledger), so it goes with its file."""
        if self._wal is not None and _identity(path + "-wal") == self._wal:
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(path + suffix)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Driver errors (server gone, disk full, lock timeout, a corrupt file) become one LedgerError, password
        masked. A constraint violation stays itself: its caller reads the winner of the race."""
        try:
            yield
        except IntegrityError:
            raise
        except DatabaseError as exc:
            detail = scrub(str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc), self.engine.url)
            raise LedgerError(f"ledger {self.url}: {detail}") from exc

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


def _file_identity(engine: Engine) -> tuple[str, tuple[int, int]] | None:
    """The SQLite file an engine names and its (device, inode) now; None for PostgreSQL or no file yet."""
    db = sqlite_path(engine.url)  # the file sqlite3 opens, whatever form the URL takes (a file: URI too)
    if db is None:
        return None
    found = _identity(str(db))
    return None if found is None else (os.path.abspath(db), found)


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
