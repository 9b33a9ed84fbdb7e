"""The ledger replaced, deleted or corrupted under a running process: every write transaction first checks
that its ledger is still the file (inode) and schema it opened, and stops with one LedgerError; a corrupt
file is one error line from `status`, not a traceback."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import ROOT


def _sweep(led: Ledger, name: str) -> None:
    led.create_or_get_sweep(name, stage="smoke", config_yaml="{}", model="m", hardware="h", workload="w", provenance={})


def test_a_deleted_ledger_stops_the_next_write(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with Ledger.open(f"sqlite:///{path}") as led:
        _sweep(led, "a")
        for f in tmp_path.glob("ledger.sqlite*"):
            f.unlink()
        with pytest.raises(LedgerError, match="was deleted while this process used it"):
            _sweep(led, "b")
    assert not path.exists()  # nothing wrote a new ledger in its place


def test_a_replaced_ledger_stops_the_next_write_and_the_replacement_is_left_intact(tmp_path):
    path, other = tmp_path / "ledger.sqlite", tmp_path / "other.sqlite"
    with Ledger.open(f"sqlite:///{other}") as theirs:
        _sweep(theirs, "theirs")
    with Ledger.open(f"sqlite:///{path}") as led:
        _sweep(led, "a")
        shutil.copy(other, tmp_path / "swap.sqlite")
        os.replace(tmp_path / "swap.sqlite", path)  # a new inode at the same path
        with pytest.raises(LedgerError, match="was replaced by another file"):
            _sweep(led, "b")
    with Ledger.open(f"sqlite:///{path}", create=False) as now:
        assert [s.name for s in now.list_sweeps()] == ["theirs"]
        assert now.engine.connect().exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"


def _checkpoint(led: Ledger) -> None:
    raw = led.engine.raw_connection()
    try:
        raw.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
    finally:
        raw.close()


@pytest.mark.long
@pytest.mark.parametrize("foreign", ["another ledger", "a plain SQLite file", "an older copy of itself"])
def test_a_ledger_overwritten_in_place_stops_the_next_write_and_the_copied_in_file_is_left_intact(tmp_path, foreign):
    """Issue 45 item 5: `cp other.sqlite live.sqlite` keeps the inode and the schema revision; the sweep went on,
    and at close its WAL was checkpointed over the copied-in pages. Now the next write stops, naming the cause,
    and the closed ledger leaves the copied-in file byte for byte as it was copied."""
    path, other = tmp_path / "ledger.sqlite", tmp_path / "other.sqlite"
    if foreign == "another ledger":
        with Ledger.open(f"sqlite:///{other}") as theirs:
            _sweep(theirs, "theirs")
    elif foreign == "a plain SQLite file":
        con = sqlite3.connect(other)
        con.execute("CREATE TABLE notes (x)")
        con.execute("INSERT INTO notes VALUES ('mine')")
        con.commit()
        con.close()
    with Ledger.open(f"sqlite:///{path}") as led:
        _sweep(led, "a")  # the first write gives the ledger its id, and puts it into the file
        _sweep(led, "b")
        if foreign == "an older copy of itself":
            shutil.copyfile(path, other)
            for i in range(200):  # the ledger grows (page 1 changes), a checkpoint writes it: the copy is behind
                _sweep(led, f"grow-{i}")
            _checkpoint(led)
            _sweep(led, "c")
        for i in range(20):  # pages in the WAL, not yet checkpointed: what a close would copy into the file
            _sweep(led, f"late-{i}")
        copied = other.read_bytes()
        inode = path.stat().st_ino
        shutil.copyfile(other, path)  # in place: the same inode, truncated and rewritten
        assert path.stat().st_ino == inode
        with pytest.raises(LedgerError, match="was overwritten in place while this process used it") as err:
            _sweep(led, "d")
        assert {"another ledger": "another database was copied over it", "a plain SQLite file": "no ledger id"}.get(
            foreign, "an older copy was written over it"
        ) in str(err.value)
        with pytest.raises(LedgerError, match="overwritten in place"):  # and every later transaction
            led.list_sweeps()
    assert path.read_bytes() == copied  # the close checkpointed nothing into it
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()


def test_a_dropped_schema_stops_the_next_write(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with Ledger.open(f"sqlite:///{path}") as led:
        _sweep(led, "a")
        with led.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE alembic_version")
        with pytest.raises(LedgerError, match="lost its schema"):
            _sweep(led, "b")


@pytest.mark.long
@pytest.mark.parametrize("damage", ["not a database", "malformed pages"])
def test_status_on_a_corrupt_ledger_is_one_error_line(tmp_path, damage):
    path = tmp_path / "ledger.sqlite"
    if damage == "not a database":
        path.write_bytes(b"this is not a database\n" * 512)
    else:  # a real ledger whose pages after the header are overwritten: SQLite opens it, queries fail
        with Ledger.open(f"sqlite:///{path}") as led:
            _sweep(led, "a")
        data = bytearray(path.read_bytes())
        data[100:] = b"\xff" * (len(data) - 100)
        path.write_bytes(bytes(data))
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "status", f"ledger.url=sqlite:///{path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    assert str(path) in lines[0], lines[0]


def test_a_file_uri_ledger_is_the_file_it_names_and_is_watched_as_that_file(tmp_path, monkeypatch):
    """`sqlite:///file:PATH?uri=true` opens PATH: its migration lock lands beside it (not under a folder named
    `file:`), and deleting PATH stops the next write as for a plain URL (the file checks read the resolved path)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "ledger.sqlite"
    with Ledger.open(f"sqlite:///file:{path}?uri=true&cache=private") as led:
        _sweep(led, "a")
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("ledger.sqlite-")) == [
            "ledger.sqlite",
            "ledger.sqlite.migrate-lock",
        ]
        for f in tmp_path.glob("ledger.sqlite*"):
            f.unlink()
        with pytest.raises(LedgerError, match="was deleted while this process used it"):
            _sweep(led, "b")
