"""The SQLite file under a Store: is it still the ledger this process opened?

Why: a ledger deleted, replaced (a new inode at its path) or overwritten in place (`cp other.sqlite
live.sqlite`: the same inode and the same schema revision) under a running sweep took the sweep's writes
nowhere or into a stranger's file, and SQLite, at the last close, checkpointed this process's write-ahead log
over the copied-in pages: the user's file was destroyed without a word. `FileWatch.check` runs before every
transaction of a Store (orchestrator/ledger/store.py) and stops it with one LedgerError naming the cause.

What identifies a ledger in place: its id, a random 31-bit number in the database header's user_version
(offset 60; SQLite never writes it, the orchestrator nowhere else), given by the first write transaction on a
ledger without one and checkpointed into the file at once; and the header's database size in pages (offset
28), which never goes down for a ledger (nothing VACUUMs it, and freed pages stay in the file), so a copy of
this ledger from before it last grew is behind it. (The file change counter would be the natural mark, but in
WAL mode SQLite leaves it alone.) Both are read from the file itself, past SQLite: SQLite reads a page from its
WAL first, so a page the WAL holds hides what the file now holds. What it cannot tell: a copy of this same
ledger taken since the file last grew; and a VACUUM of a ledger in use reads as an older copy.

The file is read through one descriptor per file and process, opened once and closed when the last Store
watching it closes: closing any descriptor of a file drops every POSIX lock the process holds on it, SQLite's
own included (https://www.sqlite.org/howtocorrupt.html, section 2.2), so a read-and-close would let another
process delete the WAL under this one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from orchestrator.core.redact import redact
from orchestrator.ledger.errors import LedgerError

MAGIC = b"SQLite format 3\x00"
HEADER = 100  # bytes of the database header (https://www.sqlite.org/fileformat.html#the_database_header)
ID_MAX = 2**31 - 1  # user_version is a signed 32-bit integer; 0 means "no id yet"

_HELD: dict[tuple[int, int], list[int]] = {}  # (device, inode) -> [descriptor, watches reading through it]
_HELD_LOCK = threading.Lock()


@dataclass(frozen=True)
class Header:
    """What the file's own header says (None from `FileWatch.header` when it cannot be read)."""

    sqlite: bool  # starts with SQLite's magic string (and is at least a header long)
    ledger_id: int  # user_version: 0 for none
    pages: int  # the database size in pages (0: the header does not say; SQLite then reads the file's size)


class FileWatch:
    """One Store's view of its SQLite file: the (device, inode) it opened, the ledger id and the most pages it
    read from the file, and its WAL's (device, inode) at its last write."""

    def __init__(self, path: str, opened: tuple[int, int]) -> None:
        self.path, self.opened = path, opened
        self.wal: tuple[int, int] | None = None
        self.ledger_id: int | None = None  # known once read from the file or by a write transaction
        self.id_on_disk = False  # the file itself carried it: from then on it must
        self.pages = 0
        self._held = _hold(path, opened)
        first = self.header()
        self.was_sqlite = first is not None and first.sqlite
        if first is not None and first.sqlite:
            self._note(first)

    @classmethod
    def of(cls, path: Path | None) -> FileWatch | None:
        """The watch of an existing SQLite file (None for PostgreSQL, or no file yet)."""
        if path is None:
            return None
        found = identity(str(path))
        return None if found is None else cls(os.path.abspath(path), found)

    def close(self) -> None:
        """Called once the Store's connections are closed (see the module docstring)."""
        if self._held is not None:
            _release(self._held[0])
            self._held = None

    def header(self) -> Header | None:
        if self._held is None:
            return None
        try:
            head = os.pread(self._held[1], HEADER, 0)
        except OSError:
            return None
        if len(head) < HEADER or not head.startswith(MAGIC):
            return Header(False, 0, 0)
        changes, valid_for = head[24:28], head[92:96]  # the size field holds only when these two agree
        pages = int.from_bytes(head[28:32], "big") if changes == valid_for else 0
        return Header(True, int.from_bytes(head[60:64], "big", signed=True), pages)

    def check(self) -> None:
        """Raise LedgerError when the file at the path is not the ledger this store opened: deleted, replaced,
        or overwritten in place. An overwritten file's WAL is emptied first (`disarm_wal`)."""
        now = identity(self.path)
        if now != self.opened:
            self.drop_stale_wal()
            what = "deleted" if now is None else "replaced by another file"
            raise LedgerError(f"the ledger file {self.path} was {what} while this process used it: stopping")
        head = self.header()
        cause = self._foreign(head)
        if cause:
            self.disarm_wal()
            raise LedgerError(
                f"the ledger file {self.path} was overwritten in place while this process used it ({cause}): "
                "stopping before writing to it; this process's write-ahead log was emptied so that no checkpoint "
                "copies its pages over the file. The jobs' results stay in their folders: point ledger.url at a "
                "new file and `python -m orchestrator ledger ingest` the sweep's job folders, or restore the ledger "
                "from a backup, then `resume`"
            )
        if head is not None and head.sqlite:
            self._note(head)

    def _foreign(self, head: Header | None) -> str:
        """Why `head` is not this ledger's ('' when it may be; an unreadable header says nothing)."""
        if head is None or not self.was_sqlite:
            return ""
        if not head.sqlite:
            return "it is no SQLite database any more"
        if self.ledger_id is not None and head.ledger_id != self.ledger_id and (head.ledger_id or self.id_on_disk):
            other = f"ledger id {head.ledger_id}" if head.ledger_id else "no ledger id"
            return (
                f"it holds {other}, this process opened ledger id {self.ledger_id}: another database was copied over it"
            )
        if 0 < head.pages < self.pages:
            return (
                f"it has {head.pages} pages, fewer than the {self.pages} it had: an older copy was written over it "
                "(a ledger in use never shrinks: VACUUM one only when nothing uses it)"
            )
        return ""

    def _note(self, head: Header) -> None:
        if head.ledger_id and self.ledger_id is None:
            self.ledger_id = head.ledger_id
        if head.ledger_id and head.ledger_id == self.ledger_id:
            self.id_on_disk = True
        self.pages = max(self.pages, head.pages)

    def claim_id(self, s: Session) -> int | None:
        """Inside a write transaction: the ledger's id as SQLite reads it; a ledger without one gets one here. The
        new id is returned, to be `adopt`ed once its transaction committed (a rolled-back id is no one's)."""
        current = int(s.execute(text("PRAGMA user_version")).scalar() or 0)
        if current:
            self.ledger_id = current
            return None
        new = secrets.randbelow(ID_MAX) + 1
        s.execute(text(f"PRAGMA user_version = {new}"))
        return new

    def adopt(self, new_id: int, engine: Engine) -> None:
        """The id is committed: push it into the file now (a passive checkpoint, best effort), so the file carries
        it from here on and an id-less file copied over it is seen."""
        self.ledger_id = new_id
        with contextlib.suppress(Exception):
            raw = engine.raw_connection()
            try:
                raw.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)")  # type: ignore[union-attr]
            finally:
                raw.close()

    def noted_wal(self) -> None:
        self.wal = identity(self.path + "-wal")

    def drop_stale_wal(self) -> None:
        """Our write-ahead log, left beside a file that is no longer ours: SQLite would replay its frames into
        whatever file is opened at the path next (the replacement, or a new ledger), so it goes with its file."""
        if self.wal is not None and identity(self.path + "-wal") == self.wal:
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(self.path + suffix)

    def disarm_wal(self) -> None:
        """The file was overwritten in place, so every frame of its WAL belongs to the ledger it was: truncated
        to nothing (by path: no descriptor of it is opened or closed, so no lock is dropped), a checkpoint at the
        last close reads no frame and writes none into the file (SQLite stops at the first short read)."""
        with contextlib.suppress(OSError):
            os.truncate(self.path + "-wal", 0)


# SQLite's POSIX lock bytes: in WAL mode a writer holds byte 120 of the -shm file (the write lock; 121 and 122:
# checkpoint, recovery); in rollback mode the lock bytes of the database file from 2**30 (pending, reserved,
# shared: https://www.sqlite.org/lockingv3.html).
WAL_LOCKS = range(120, 123)
DB_LOCKS = range(2**30, 2**30 + 512)


def lock_holders(path: str) -> list[str]:
    """Who holds the write lock of the SQLite file at `path`, as the kernel lists it (/proc/locks: Linux):
    'pid 123 (sqlite3 ledger.sqlite)' each, the command line masked; [] where that cannot be told."""
    targets: dict[tuple[int, int], range] = {}
    for suffix, span in (("-shm", WAL_LOCKS), ("", DB_LOCKS)):
        found = identity(path + suffix)
        if found is not None:
            targets[found] = span
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids: list[int] = []
    for line in lines:
        parts = line.split()
        if len(parts) < 8 or parts[1] == "->" or parts[1] != "POSIX" or parts[3] != "WRITE":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            key = (os.makedev(int(major, 16), int(minor, 16)), int(inode))
            start, end = int(parts[6]), (2**63 if parts[7] == "EOF" else int(parts[7]))
            pid = int(parts[4])
        except ValueError:
            continue
        lock = targets.get(key)
        if lock is not None and start <= lock[-1] and end >= lock[0] and pid not in pids:
            pids.append(pid)
    return [f"pid {pid} ({_command(pid)})" if pid != os.getpid() else f"this process (pid {pid})" for pid in pids]


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    return redact(text if len(text) <= 80 else text[:77] + "...")


def identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _hold(path: str, opened: tuple[int, int]) -> tuple[tuple[int, int], int] | None:
    """A descriptor of the file `opened` names, shared by every watch of it in this process: (key, fd)."""
    with _HELD_LOCK:
        held = _HELD.get(opened)
        if held is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != opened:  # replaced since: `check` says so. The descriptor stays open,
                return None  # as closing it could drop a lock SQLite holds on that other file
            held = _HELD[opened] = [fd, 0]
        held[1] += 1
        return opened, held[0]


def _release(key: tuple[int, int]) -> None:
    with _HELD_LOCK:
        held = _HELD.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del _HELD[key]
            with contextlib.suppress(OSError):
                os.close(held[0])
