"""The whole sweep's price (orchestrator/sweep/price.py, issue 48 item 4): the policy's own sweep simulated on
surfaces drawn from the planner's predictions and error bands; the mean with a 90% range."""

from __future__ import annotations

import math

import pytest

from orchestrator.config import compose
from orchestrator.core.price import SweepPrice, against
from orchestrator.sweep.price import interval, price

SMALL_1K = ["+stage=1k", "stage.budget.max_runs=6", "stage.budget.max_rounds=3"]


@pytest.mark.long
def test_the_range_holds_the_mean_of_the_simulated_sweeps():
    composed = compose(SMALL_1K)
    got = price(composed.cfg, composed.to_yaml(), samples=2)
    assert len(got.samples) == 2 and all(s > 0 for s in got.samples)
    assert got.gpu_hours == pytest.approx(sum(got.samples) / 2)
    assert got.lo <= got.gpu_hours <= got.hi
    assert got.cluster_hours > 0 and got.gpus == 1024
    # at most the budget: the simulated sweep stops where the driver stops
    assert max(got.samples) <= composed.cfg.stage.budget.max_gpu_hours * 1.05
    assert "simulated" in got.line() and f"{got.gpu_hours:,.0f} GPU-h" in got.line()


def test_the_interval_is_a_point_without_spread_and_widens_with_it():
    assert interval([100.0, 100.0]) == pytest.approx((100.0, 100.0))
    lo, hi = interval([50.0, 200.0])
    assert lo < 50.0 and hi > 200.0
    lo2, hi2 = interval([80.0, 125.0])
    assert lo < lo2 < 80.0 and 125.0 < hi2 < hi
    assert interval([7.0]) == pytest.approx((7.0, 7.0))


def test_spend_is_said_against_the_stored_range():
    p = SweepPrice(gpu_hours=1000.0, lo=600.0, hi=1800.0, cluster_hours=1.0, samples=(800.0, 1200.0), gpus=1024)
    stored = {"price": p.to_dict()}
    assert SweepPrice.from_dict(p.to_dict()) == p
    assert "inside the range" in (against(stored, 700.0) or "")
    assert "under the range" in (against(stored, 100.0) or "")
    over = against(stored, 2000.0) or ""
    assert "over the range" in over and "200% of expected" in over and "90%: 600-1,800" in over
    assert against({}, 10.0) is None and against(None, 10.0) is None
    assert not math.isnan(p.gpu_hours)
