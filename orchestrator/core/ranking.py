"""What counts as the measured best: the one rule every reader of measurements ranks with.

Why one owner: `best`, the sweep's last line, the live view, finalists, promotion, the search, the report
and the ledger's query each used to sort measurements with their own filter and tie-break, and two of
them named different layouts for the same sweep. Every one of them now maps its row to a `Standing` and
asks `ranked` / `best` here.

Eligibility: a full-window result (a screen ranks contenders, a fit probe answers "does it fit?": neither
decides a best), not partial (the job stopped before its window ended), not excluded (it failed the
correctness gate), and with a measured step p50. Order: step p50, then p99, then lower heaviest-rank peak
memory (more headroom), then the row's own order (its ledger id) so that the answer is stable.

A screen's p50 still orders contenders (which to confirm, where a move starts): `ranked(..., screens=True)`
ranks screened rows beside full ones with the same order, and never decides a best (`best` has no such flag).
The figures come from a result's metric columns (`standing`, orchestrator.core.metrics names them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.core.metrics import STEP_P50, STEP_P99, peak_gb
from orchestrator.core.states import Fidelity

T = TypeVar("T")
# The rule in words, as `best`, the report and `status` say what a best was chosen on.
RULE = "measured step p50 of full-window, complete results that passed parity; tie-break p99, then lower peak memory"

INF = math.inf


@dataclass(frozen=True)
class Standing:
    """One measurement as the ranking sees it."""

    p50_s: float | None
    p99_s: float | None = None
    peak_gb: float | None = None
    fidelity: Fidelity = Fidelity.FULL
    partial: bool = False
    excluded: bool = False
    order: int = 0  # the last tie-break: the ledger id of the result (earlier first)

    @property
    def eligible(self) -> bool:
        """Can this measurement be a best at all (see the module docstring)."""
        return self.ranks(screens=False)

    def ranks(self, *, screens: bool = False) -> bool:
        """Does it take a place in a ranking: eligible, or (screens) a screen that is otherwise eligible."""
        allowed = (Fidelity.FULL, Fidelity.SCREEN) if screens else (Fidelity.FULL,)
        return (
            Fidelity(self.fidelity) in allowed
            and not self.partial
            and not self.excluded
            and self.p50_s is not None
            and self.p50_s > 0
        )

    def key(self) -> tuple[float, float, float, int]:
        """Sort key, best first: p50, p99, peak memory (a missing p99 or peak sorts last), order."""
        return (
            float(self.p50_s if self.p50_s is not None else INF),
            float(self.p99_s if self.p99_s is not None else INF),
            float(self.peak_gb if self.peak_gb is not None else INF),
            self.order,
        )


def standing(
    values: Mapping[str, Any],
    *,
    fidelity: Fidelity | str = Fidelity.FULL,
    partial: bool = False,
    excluded: bool = False,
    order: int = 0,
) -> Standing:
    """The Standing of one result from its metric columns (a ledger row's metrics, a `compare` row)."""
    return Standing(
        p50_s=values.get(STEP_P50),
        p99_s=values.get(STEP_P99),
        peak_gb=peak_gb(values),
        fidelity=Fidelity(fidelity),
        partial=bool(partial),
        excluded=bool(excluded),
        order=order,
    )


def ranked(rows: Iterable[T], standing: Callable[[T], Standing], *, screens: bool = False) -> list[T]:
    """The eligible rows, best first; with `screens`, screened rows too (they order contenders, never a best).
    Rows that tie on every figure and on `order` keep their given order."""
    scored = [(standing(r), r) for r in rows]
    return [r for s, r in sorted(((s, r) for s, r in scored if s.ranks(screens=screens)), key=lambda sr: sr[0].key())]


def ordered(rows: Iterable[T], standing: Callable[[T], Standing]) -> list[T]:
    """Every row with a measured p50 in the ranking's order, eligible or not: a table that shows the partial,
    excluded and screened rows where their figures put them (marked, never chosen: `eligible` says which)."""
    scored = [(standing(r), r) for r in rows]
    return [r for s, r in sorted(((s, r) for s, r in scored if s.p50_s), key=lambda sr: sr[0].key())]


def best(rows: Iterable[T], standing: Callable[[T], Standing]) -> T | None:
    """The measured best of `rows`, or None when no row is eligible."""
    out = ranked(rows, standing)
    return out[0] if out else None
