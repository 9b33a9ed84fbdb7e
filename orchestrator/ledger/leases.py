"""Sweep leases: who drives a sweep and until when, so two orchestrators never drive the same one.

A lease is one row per sweep, taken, renewed and released in one short write each. The holder is
`host:pid:start` (start: the process's start time, so a reused pid is not mistaken for the holder).
An expired lease is taken over only when its holder cannot be alive: on this host the pid decides at
once (gone, a zombie or another process: taken over at once; alive: refused even when expired, it may
just be slow to renew); on another host only expiry can tell. `LeaseKeeper` renews from a thread no
wait of the sweep loop blocks, on its own connections with short lock timeouts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.exc import IntegrityError

from orchestrator.core.proc import start_time, stat
from orchestrator.core.states import EventKind
from orchestrator.ledger import models as m
from orchestrator.ledger.convert import now
from orchestrator.ledger.errors import LeaseHeld, LedgerError
from orchestrator.ledger.store import Store, find_sweep

log = logging.getLogger("db")


def holder_id() -> str:
    """This process as a lease holder: `host:pid:start`, shown to a second orchestrator that is refused."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{start_time(pid)}"


def holder_alive(holder: str) -> bool | None:
    """Whether the holder process lives: True/False for a holder of this host, None for another host
    (or a holder id this code did not write), where only the lease's expiry can tell."""
    host, _, rest = holder.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: a process of another user holds this pid
        pass
    fields = stat(int(pid))
    if fields == []:
        return False
    if fields is None:
        return True
    if fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent
        return False
    return not (start and len(fields) > 19 and fields[19] != start)  # a new process reuses the pid


@dataclass(frozen=True)
class LeaseInfo:
    """Who drives a sweep (for `status`): the holder, its times, whether it is alive (None: unknowable
    from this host) and whether its lease has expired."""

    holder: str
    acquired_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    alive: bool | None
    expired: bool


class Leases:
    """The lease rows of one database: `ledger.leases` (it holds the ledger's Store, it is not a Ledger)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def acquire_lease(self, sweep: str, holder: str, ttl_s: float) -> None:
        """Take (or renew) the sweep's lease in one transaction. Another holder's lease is taken over
        (logged) when that holder is dead on this host, or expired on another host; else LeaseHeld."""
        for _ in range(3):
            try:
                with self.store.write() as s:
                    sw = find_sweep(s, sweep)
                    t = now()
                    lease = s.scalars(select(m.Lease).where(m.Lease.sweep_id == sw.id).with_for_update()).one_or_none()
                    if lease is None:
                        s.add(
                            m.Lease(
                                sweep_id=sw.id,
                                holder=holder,
                                acquired_at=t,
                                heartbeat_at=t,
                                expires_at=t + timedelta(seconds=ttl_s),
                            )
                        )
                        s.add(m.Event(sweep_id=sw.id, kind=EventKind.LEASE, message=f"lease taken by {holder}"))
                    elif lease.holder == holder:
                        lease.heartbeat_at, lease.expires_at = t, t + timedelta(seconds=ttl_s)
                    else:
                        alive = holder_alive(lease.holder)
                        if alive is False:
                            why = "process gone"
                        elif alive is None and lease.expires_at <= t:
                            why = f"expired {lease.expires_at:%H:%M:%S}"
                        else:
                            raise LeaseHeld(sweep, lease.holder, lease.expires_at, alive=alive)
                        msg = f"stale lease of {lease.holder} ({why}) taken over by {holder}"
                        log.warning("sweep %s: %s", sweep, msg)
                        s.add(
                            m.Event(
                                sweep_id=sw.id,
                                kind=EventKind.LEASE,
                                message=msg,
                                data={"previous_holder": lease.holder},
                            )
                        )
                        lease.holder, lease.acquired_at, lease.heartbeat_at = holder, t, t
                        lease.expires_at = t + timedelta(seconds=ttl_s)
                return
            except IntegrityError:  # another process inserted the first lease row: read it again
                continue
        raise LedgerError(f"could not take the lease of sweep '{sweep}' (contention)")

    def heartbeat(self, sweep: str, holder: str, ttl_s: float | None = None) -> None:
        """Extend our lease by its TTL; LeaseHeld if someone took it over (we must stop driving)."""
        with self.store.write() as s:
            sw = find_sweep(s, sweep)
            lease = s.scalars(select(m.Lease).where(m.Lease.sweep_id == sw.id).with_for_update()).one_or_none()
            if lease is None or lease.holder != holder:
                if lease is not None:
                    raise LeaseHeld(sweep, lease.holder, lease.expires_at)
                raise LedgerError(f"{holder} holds no lease on sweep '{sweep}'")
            ttl = ttl_s if ttl_s is not None else (lease.expires_at - lease.heartbeat_at).total_seconds()
            t = now()
            lease.heartbeat_at, lease.expires_at = t, t + timedelta(seconds=ttl)

    def release_lease(self, sweep: str, holder: str) -> None:
        with self.store.write() as s:
            sw = find_sweep(s, sweep)
            # A DELETE's result is a CursorResult (Session.execute is typed for SELECTs): it counts the rows.
            deleted = s.execute(delete(m.Lease).where(m.Lease.sweep_id == sw.id, m.Lease.holder == holder))
            gone = cast("CursorResult[Any]", deleted).rowcount
            if gone:
                s.add(m.Event(sweep_id=sw.id, kind=EventKind.LEASE, message=f"lease released by {holder}"))

    def lease(self, sweep: str) -> LeaseInfo | None:
        """The sweep's lease now (None: nobody drives it), with the holder's liveness as seen from here."""
        with self.store.read() as s:
            sw = find_sweep(s, sweep)
            lease = s.scalars(select(m.Lease).where(m.Lease.sweep_id == sw.id)).one_or_none()
            if lease is None:
                return None
            return LeaseInfo(
                holder=lease.holder,
                acquired_at=lease.acquired_at,
                heartbeat_at=lease.heartbeat_at,
                expires_at=lease.expires_at,
                alive=holder_alive(lease.holder),
                expired=lease.expires_at <= now(),
            )


class LeaseKeeper:
    """Renews one lease every ttl/3 from a daemon thread, so a sweep loop blocked in a wait (a free local
    slot, a slow sacct, a PostgreSQL lock) keeps its lease. Its own engine waits at most `lock_wait_s` for
    a lock (SQLite busy_timeout, PostgreSQL lock_timeout + statement_timeout): a blocked renew fails fast
    and is retried. `lost` is set when another holder took the lease; the loop checks it (`check`)."""

    def __init__(self, store: Store, sweep: str, holder: str, ttl_s: float) -> None:
        from orchestrator.ledger.engine import make_engine

        self.sweep, self.holder, self.ttl = sweep, holder, float(ttl_s)
        self.every = max(0.05, self.ttl / 3)
        wait_ms = int(max(100.0, min(2000.0, 1000 * self.ttl / 6)))
        self._store = Store(make_engine(store.engine.url, busy_timeout_ms=wait_ms, lock_timeout_ms=wait_ms))
        self._leases = Leases(self._store)
        self._stop = threading.Event()
        self.lost: LeaseHeld | None = None
        self.renewals = 0
        self.failures = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"lease-{sweep}", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def _run(self) -> None:
        wait = self.every
        while not self._stop.wait(wait):
            try:
                self._leases.heartbeat(self.sweep, self.holder, self.ttl)
                self.renewals += 1
                wait = self.every
            except LeaseHeld as held:
                self.lost = held
                log.warning("sweep %s: lease lost to %s", self.sweep, held.holder)
                return
            except Exception as exc:  # noqa: BLE001 - a lock timeout or a dropped connection: retry soon
                self.failures += 1
                self.last_error = str(exc)[:300]
                wait = min(self.every, 0.5)

    def check(self) -> None:
        """Raise LeaseHeld in the caller's thread if the lease was taken over."""
        if self.lost is not None:
            raise self.lost

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.ttl))
        self._store.close()
