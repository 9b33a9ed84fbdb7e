"""Every stop of a ledger transaction names its real cause (issue 45 item 6). A lock held past the wait and a
connection dropped at the revision check both read "the ledger ... lost its schema while in use" (any driver
error of that first statement), which invited a `db upgrade` on a fresh file. Now a held lock names itself and,
on SQLite, the process that holds it; a lost connection says so; both say how to go on; only a schema that is
really gone reads as one."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, create_engine, event

from orchestrator.ledger.engine import make_engine
from orchestrator.ledger.errors import LedgerError, LedgerStopped
from orchestrator.ledger.ledger import Ledger
from orchestrator.ledger.store import Store
from tests.sweeplib import wait_for


def _sweep(led: Ledger, name: str) -> None:
    led.create_or_get_sweep(name, stage="smoke", config_yaml="{}", model="m", hardware="h", workload="w", provenance={})


@contextmanager
def held_lock(url: str) -> Iterator[int | None]:
    """Another process (SQLite: a `BEGIN IMMEDIATE` in a child; PostgreSQL: a session holding ACCESS EXCLUSIVE on
    alembic_version) holds the ledger's lock until the block ends; yields the holder's pid on SQLite. Returns
    once the lock is held: the child says so on its stdout."""
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        code = (
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); sys.stdin.read()"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "held"
            yield child.pid
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=60)
        return
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE")  # in its transaction
            yield None
            conn.rollback()
    finally:
        engine.dispose()


def test_a_lock_held_past_the_wait_is_named_with_its_holder_not_a_lost_schema(ledger_url):
    with Ledger.open(ledger_url) as led:
        _sweep(led, "a")
    # the wait of the lease keeper's store: SQLite's busy timeout, PostgreSQL's lock timeout
    store = Store(make_engine(ledger_url, busy_timeout_ms=200, lock_timeout_ms=200))
    try:
        with held_lock(ledger_url) as pid, pytest.raises(LedgerStopped) as err:
            with store.write():
                pass
    finally:
        store.close()
    line = str(err.value)
    assert "is locked" in line and "lost its schema" not in line, line
    assert "then run the command again" in line, line
    if pid is not None:
        assert f"pid {pid} (" in line and "held its write lock longer than ledger.busy_timeout_ms" in line, line


def _drop_connection_at_the_revision_check(engine: Engine, url: str) -> None:
    """The connection goes away just as the write transaction's first statement (the revision check) is sent:
    on PostgreSQL its backend is terminated from another session; on SQLite, which has no server, the driver's
    error is flagged a disconnect, as SQLAlchemy flags a dropped PostgreSQL connection."""
    armed = [True]

    @event.listens_for(engine, "before_cursor_execute")
    def drop(conn, _cursor, statement, *_args) -> None:
        if not (armed and "alembic_version" in statement):
            return
        armed.clear()
        if url.startswith("sqlite"):
            raise sqlite3.OperationalError("the connection went away (simulated)")
        pid = int(conn.connection.dbapi_connection.info.backend_pid)
        admin = create_engine(url)
        try:
            with admin.connect() as other:
                other.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")
                other.commit()

                def gone() -> bool:  # the event: its backend exited (a fresh snapshot each time: one per transaction)
                    left = other.exec_driver_sql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}").scalar()
                    other.rollback()
                    return left == 0

                wait_for(gone, 60, "the backend to exit", every=0.05)
        finally:
            admin.dispose()

    if url.startswith("sqlite"):

        @event.listens_for(engine, "handle_error")
        def disconnect(ctx) -> None:
            ctx.is_disconnect = True


def test_a_connection_dropped_at_the_revision_check_says_so_not_a_lost_schema(ledger_url):
    with Ledger.open(ledger_url) as led:
        _sweep(led, "a")
        _drop_connection_at_the_revision_check(led.engine, ledger_url)
        with pytest.raises(LedgerStopped) as err:
            _sweep(led, "b")
        line = str(err.value)
        assert "the connection to the ledger at" in line and "was lost" in line, line
        assert "lost its schema" not in line and "db upgrade" not in line, line
        assert [s.name for s in led.list_sweeps()] == ["a"]  # the next transaction reconnects; nothing half-written
        _sweep(led, "b")


def test_a_schema_really_gone_still_reads_as_one(ledger_url):
    with Ledger.open(ledger_url) as led:
        _sweep(led, "a")
        with led.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE alembic_version")
        with pytest.raises(LedgerError, match="lost its schema while in use") as err:
            _sweep(led, "b")
        assert not isinstance(err.value, LedgerStopped)
