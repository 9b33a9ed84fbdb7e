"""Which of a sweep's candidates the early cut stopped, read from its `cut` events (the driver's
orchestrator/sweep/cutoff.py writes them): `status` and the report's search path show them."""

from __future__ import annotations

from orchestrator.core.states import EventKind
from orchestrator.ledger.ledger import Ledger


def cut_candidates(ledger: Ledger, sweep: str) -> set[int]:
    """Ids of the sweep's candidates the cut stopped (its events: `status`, the search path)."""
    return {e.candidate_id for e in ledger.events(sweep, kind=EventKind.CUT) if e.candidate_id is not None}
