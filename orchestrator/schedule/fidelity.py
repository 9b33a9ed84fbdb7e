"""The screen's contenders (successive halving with the p50's confidence interval as the cut), on the window
arithmetic of orchestrator/core/windows.py, which this module re-exports for the schedule's callers
(`fidelity.window`, `fidelity.decision_window`, ...): the rungs' arithmetic has one owner, in core, so the read
model (orchestrator/history) and the report use it without importing the schedule."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core.states import Fidelity
from orchestrator.core.windows import (
    MEDIAN_SE,
    Z95,
    CutLine,
    cut_line,
    decision_window,
    half_width,
    learned_warmup,
    pooled_cv,
    running_line,
    screen_iters,
    startup_s,
    use_screen,
    warm_start_on,
    window,
)
from orchestrator.search.select import measured_rank
from orchestrator.search.types import Observation

__all__ = [
    "MEDIAN_SE",
    "Z95",
    "CutLine",
    "contenders",
    "cut_line",
    "decision_window",
    "half_width",
    "learned_warmup",
    "pooled_cv",
    "running_line",
    "screen_iters",
    "startup_s",
    "use_screen",
    "warm_start_on",
    "window",
]


def contenders(rows: Sequence[Observation], cv: float | None, limit: int) -> list[Observation]:
    """Screened layouts not yet confirmed that the screen cannot separate from the best (successive halving
    with the CI as the cut): a screened p50 whose lower 95% bound is at or below the reference, where the
    reference is the best full-window p50 (or the best screened upper bound, if that is lower). Best first."""
    screened = [r for r in rows if r.ok and r.fidelity == Fidelity.SCREEN and r.failure_class is None]
    if not screened or limit <= 0:
        return []
    noise = cv or 0.0

    def lo(r: Observation) -> float:
        return r.measured_step_s * (1.0 - half_width(noise, r.measure_iters or 1))

    def hi(r: Observation) -> float:
        return r.measured_step_s * (1.0 + half_width(noise, r.measure_iters or 1))

    full = [r.measured_step_s for r in rows if r.ok and r.fidelity == Fidelity.FULL]
    ref = min([*full, *(hi(r) for r in screened)])
    return measured_rank([r for r in screened if lo(r) <= ref])[:limit]  # the one ranking, screens included
