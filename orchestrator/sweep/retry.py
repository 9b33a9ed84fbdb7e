"""Which failed attempts are submitted again: the one retry decision (the sweep loop and the finalists).

Pure: the caller passes the attempt history (from the ledger). What each class allows is orchestrator.core.failures'
table: `policy.driver.retry_classes` (whose default is the table's retried classes) says which classes are
retried, the table says how often (TIMEOUT once, the others up to max_attempts); a class asked for on the
command line (--retry oom) is retried up to max_attempts whatever the table says, and so is a class the
table retries ALWAYS (LOST: the job gave no verdict; a sweep's stored retry_classes may predate the class).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from orchestrator.core.failures import BY_NAME, DEFAULT_RETRY_CLASSES, Retry
from orchestrator.core.schema import PolicyConfig


def retry_decision(
    fc: str | None,
    history: Sequence[str | None],
    *,
    max_attempts: int,
    retry_classes: Sequence[str] = DEFAULT_RETRY_CLASSES,
    asked: Iterable[str] = (),
) -> tuple[bool, str]:
    """(retry?, why) for an attempt that failed with `fc`; `history` = failure classes of every attempt so far
    (this one included). `fc` may also be a Slurm state the attempt ended in without a class (no retry)."""
    asked = {c.upper() for c in asked}
    if len(history) >= max_attempts:
        return False, f"{len(history)} attempt(s) = max_attempts"
    known = BY_NAME.get(fc or "")
    if fc in asked or (known is not None and known.retry is Retry.ALWAYS):
        return True, f"attempt {len(history) + 1} of {max_attempts}"
    if fc not in {c.upper() for c in retry_classes}:
        return False, "deterministic" if known is not None and known.deterministic else "not a retryable class"
    if known is not None and known.retry is Retry.ONCE:
        seen = sum(1 for x in history if x == fc)
        return (True, f"{fc} is retried once") if seen <= 1 else (False, f"{fc} already retried once")
    return True, f"attempt {len(history) + 1} of {max_attempts}"


def retry_attempts(fc: str | None, attempts: Sequence[Any], policy: PolicyConfig, asked: Iterable[str] = ()):
    """`retry_decision` for an attempt of `attempts` (ledger AttemptRows, this one included) under `policy`: the
    history is their classes (else states), a launch intent that never ran (`aborted`) no try. The driver's
    (measure attempts and finalists) and `ledger ingest`'s (the verdicts of finalists' attempts it stored)."""
    return retry_decision(
        fc,
        [x.failure_class or x.state for x in attempts if not x.aborted],
        max_attempts=policy.driver.max_attempts,
        retry_classes=policy.driver.retry_classes,
        asked=asked,
    )
