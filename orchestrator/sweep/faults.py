"""The test fault hook: a crash injected at a named point of the driver (ORCH_FAULT=<point>:kill|fail).

Its own module so every step of the driver that offers a point (the loop's launch path, decide's round
transaction) imports it from below, never from the loop (decide -> loop was an import cycle)."""

from __future__ import annotations

import os
import signal

FAULT_ENV = "ORCH_FAULT"  # tests only: inject a crash at a named point of the loop (fault_point)


def fault_point(point: str) -> None:
    """Tests reproduce a crash at `point`: ORCH_FAULT=<point>:kill SIGKILLs this process there (kill -9),
    ORCH_FAULT=<point>:fail raises as a ledger that cannot be written would."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec.startswith(f"{point}:"):
        return
    if spec.endswith(":kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    from orchestrator.ledger.errors import LedgerError

    raise LedgerError(f"injected fault at {point} ({FAULT_ENV}={spec})")
