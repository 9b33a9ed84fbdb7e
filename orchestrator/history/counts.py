"""The live view's and `status`'s columns: candidates queued, running, done and failed.

Read-only (orchestrator/history/ writes nothing): recomputed from the ledger on each call, never cached across
rounds, so a resumed driver sees exactly what the killed one had written.
"""

from __future__ import annotations

from orchestrator.core.states import CandidateStatus
from orchestrator.ledger.ledger import CandidateRow


def status_counts(cands: list[CandidateRow]) -> dict[str, int]:
    """The live view's columns: queued, running, done, failed (cancelled counts as failed)."""
    counts = {"queued": 0, "running": 0, "done": 0, "failed": 0}
    for c in cands:
        if c.status in CandidateStatus.QUEUED:
            counts["queued"] += 1
        elif c.status in (CandidateStatus.RUNNING, CandidateStatus.DONE, CandidateStatus.FAILED):
            counts[c.status] += 1
        elif c.status == CandidateStatus.CANCELLED:
            counts["failed"] += 1
    return counts
