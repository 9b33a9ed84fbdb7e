"""Errors the ledger raises. Each carries `user_facing = True` so the CLI prints one line and exits 2.

orchestrator/ledger/ must not import orchestrator/, so these do not subclass orchestrator.core.errors.UserError; the CLI
recognises them by the attribute instead.
"""

from __future__ import annotations

from datetime import datetime


class LedgerError(Exception):
    """A ledger problem the user can fix (bad URL, unreachable server, schema mismatch, bad filter)."""

    user_facing = True


class LeaseHeld(LedgerError):
    """Another orchestrator drives this sweep; raised by `Ledger.acquire_lease`."""

    def __init__(self, sweep: str, holder: str, expires_at: datetime, alive: bool | None = None):
        self.sweep, self.holder, self.expires_at, self.alive = sweep, holder, expires_at, alive
        fix = (
            "its process is alive on this host: stop it first"
            if alive
            else "stop that orchestrator or wait for its lease to expire"
        )
        super().__init__(
            f"sweep '{sweep}' is driven by {holder} (lease expires {expires_at:%Y-%m-%d %H:%M:%S} UTC); {fix}"
        )


class LedgerStopped(LedgerError):
    """The ledger was out of reach for a while: locked past its wait, its server connection lost, its disk
    full. Nothing is wrong with the input, and the same work goes on once the cause is gone; `again` says how (a
    sweep sets its `resume NAME`: orchestrator.core.errors). Each names its own cause: all of them once read "the
    ledger ... lost its schema while in use", which invited a `db upgrade` on a fresh file."""

    def __init__(self, what: str, fix: str, again: str = "run the command again") -> None:
        self.what, self.fix, self.again = what, fix, again
        super().__init__(what)

    def __str__(self) -> str:
        return f"{self.what}: stopping; {self.fix}, then {self.again}"
