"""Sweep leases: who drives a sweep and until when, so two orchestrators never drive the same one.

A lease is one row per sweep, taken, renewed and released in one short write each. A holder that stops
renewing (killed with -9) loses it at `expires_at`; the next driver takes it over and says so.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.exc import IntegrityError

from db import models as m
from db.convert import now
from db.errors import LeaseHeld, LedgerError
from db.store import Store

log = logging.getLogger("db")


class Leases(Store):
    def acquire_lease(self, sweep: str, holder: str, ttl_s: float) -> None:
        """Take (or renew) the sweep's lease in one transaction; a stale lease is taken over, logged."""
        for _ in range(3):
            try:
                with self._write() as s:
                    sw = self._sweep(s, sweep)
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
                        s.add(m.Event(sweep_id=sw.id, kind="lease", message=f"lease taken by {holder}"))
                    elif lease.holder == holder:
                        lease.heartbeat_at, lease.expires_at = t, t + timedelta(seconds=ttl_s)
                    elif lease.expires_at <= t:
                        msg = (
                            f"stale lease of {lease.holder} (expired {lease.expires_at:%H:%M:%S}) "
                            f"taken over by {holder}"
                        )
                        log.warning("sweep %s: %s", sweep, msg)
                        s.add(
                            m.Event(sweep_id=sw.id, kind="lease", message=msg, data={"previous_holder": lease.holder})
                        )
                        lease.holder, lease.acquired_at, lease.heartbeat_at = holder, t, t
                        lease.expires_at = t + timedelta(seconds=ttl_s)
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
            t = now()
            lease.heartbeat_at, lease.expires_at = t, t + timedelta(seconds=ttl)

    def release_lease(self, sweep: str, holder: str) -> None:
        with self._write() as s:
            sw = self._sweep(s, sweep)
            # A DELETE's result is a CursorResult (Session.execute is typed for SELECTs): it counts the rows.
            deleted = s.execute(delete(m.Lease).where(m.Lease.sweep_id == sw.id, m.Lease.holder == holder))
            gone = cast("CursorResult[Any]", deleted).rowcount
            if gone:
                s.add(m.Event(sweep_id=sw.id, kind="lease", message=f"lease released by {holder}"))
