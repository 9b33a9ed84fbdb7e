"""Which failed attempts are submitted again. Pure: the loop passes the attempt history from the ledger."""

from __future__ import annotations

from collections.abc import Sequence


def retry_decision(
    fc: str, history: Sequence[str], *, max_attempts: int, retry_classes: Sequence[str], asked: set[str] = frozenset()
) -> tuple:
    """(retry?, why) for an attempt that failed with `fc`; `history` = failure classes of every attempt so far.

    Retryable classes (NODE_FAIL, PREEMPTED, NCCL_TIMEOUT by default) up to max_attempts; TIMEOUT once;
    deterministic failures (OOM, INVALID_CONFIG) and anything else only when asked (--retry oom).
    """
    asked = {c.upper() for c in asked}
    allowed = {c.upper() for c in retry_classes} | asked
    if len(history) >= max_attempts:
        return False, f"{len(history)} attempt(s) = max_attempts"
    if fc == "TIMEOUT" and "TIMEOUT" not in asked:
        timeouts = sum(1 for x in history if x == "TIMEOUT")
        return (True, "TIMEOUT is retried once") if timeouts <= 1 else (False, "TIMEOUT already retried once")
    if fc in allowed:
        return True, f"attempt {len(history) + 1} of {max_attempts}"
    return False, "deterministic" if fc in ("OOM", "INVALID_CONFIG") else "not a retryable class"
