"""The one ranking rule: eligibility (full window, not partial, not excluded) and order (p50, p99, peak)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.ranking import Standing, best, ranked
from orchestrator.core.states import Fidelity


def test_screens_probes_partial_and_excluded_results_never_rank():
    rows = {
        "screen": Standing(1.0, fidelity=Fidelity.SCREEN),
        "probe": Standing(1.0, fidelity=Fidelity.PROBE),
        "partial": Standing(1.0, partial=True),
        "excluded": Standing(1.0, excluded=True),
        "unmeasured": Standing(None),
        "full": Standing(2.0),
    }
    assert ranked(rows, rows.__getitem__) == ["full"]


def test_ties_break_on_p99_then_lower_peak_then_order():
    rows = {
        "a": Standing(1.0, 1.5, 70.0, order=3),
        "b": Standing(1.0, 1.2, 90.0, order=4),
        "c": Standing(1.0, 1.2, 80.0, order=5),
        "d": Standing(1.0, 1.2, None, order=1),
        "e": Standing(1.0, 1.2, 80.0, order=2),
    }
    assert ranked(rows, rows.__getitem__) == ["e", "c", "b", "d", "a"]
    assert best({}, rows.__getitem__) is None


@given(st.lists(st.tuples(st.floats(0.1, 10), st.sampled_from(list(Fidelity)), st.booleans()), max_size=12))
def test_the_best_is_the_lowest_eligible_p50(items):
    rows = [Standing(p50, fidelity=f, partial=part, order=i) for i, (p50, f, part) in enumerate(items)]
    eligible = [r for r in rows if r.fidelity == Fidelity.FULL and not r.partial]
    top = best(rows, lambda r: r)
    assert (top is None) == (not eligible)
    if top is not None:
        assert top.p50_s == min(r.p50_s for r in eligible)
