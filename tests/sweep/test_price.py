"""The whole sweep's price (orchestrator/sweep/price.py, issue 48 item 4): the policy's own sweep simulated on
surfaces drawn from the planner's predictions and error bands; the mean with a 90% range."""

from __future__ import annotations

import math

import pytest

from orchestrator.config import compose
from orchestrator.core.price import SweepPrice, against
from orchestrator.sweep.price import SampledSurface, interval, levels, price

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


def test_a_stage_two_promotions_deep_simulates_its_whole_chain_first():
    """16k promotes from 8k, which promotes from 1k: the price simulates 1k, then 8k, then 16k on each surface (a
    simulated 8k sweep alone finds no 1k sweep to promote from, so a default `sweep +stage=16k --dry-run` failed)."""
    from orchestrator.commands.sweep import sources_of

    small = ["stage.budget.max_runs=3", "stage.budget.max_rounds=2", "policy.schedule.round0_size=2"]
    composed = compose(["+stage=16k", *small])
    chain = sources_of(composed.cfg, ["+stage=16k", *small])
    assert [c.stage.name for c, _ in chain] == ["1k", "8k"]  # root first
    assert all(c.stage.budget.max_runs == 3 for c, _ in chain)  # the command's other overrides travel with it
    got = price(composed.cfg, composed.to_yaml(), chain, samples=1)
    assert got.gpus == 16384 and len(got.samples) == 1 and got.samples[0] > 0
    assert sources_of(compose(["+stage=1k"]).cfg, ["+stage=1k"]) == ()


@pytest.mark.long
def test_a_sweep_prices_itself_once_when_it_is_new_and_runnable(tmp_path, capsys):
    """A sweep's whole price (tens of CPU-seconds at scale) is asked once the sweep is known new and the cluster can
    run it: said before anything is submitted and kept in its provenance; running the same sweep again (it
    continues, already priced) does not simulate it again."""
    from orchestrator.cli import main
    from orchestrator.ledger.ledger import Ledger
    from tests.sweeplib import UNCUT, ledger_url, sweep_args

    args = sweep_args(
        tmp_path,
        "p",
        "policy.schedule.round0_size=2",
        "stage.budget.max_rounds=1",
        UNCUT,
        "stage.budget.price_samples=1",
    )
    assert main(["sweep", *args, "--plain"]) == 0
    out = capsys.readouterr().out.splitlines()
    priced = [n for n, line in enumerate(out) if line.startswith("whole sweep (simulated")]
    assert len(priced) == 1 and priced[0] < next(n for n, line in enumerate(out) if line.startswith("submitted "))
    with Ledger.open(ledger_url(tmp_path)) as led:
        stored = led.get_sweep("p").provenance["price"]
    assert stored["gpu_hours"] > 0 and len(stored["samples"]) == 1
    main(["sweep", *args, "--plain"])
    again = capsys.readouterr().out
    assert "sweep p " in again and "whole sweep (simulated" not in again, again[-2000:]


def test_the_interval_is_a_point_without_spread_and_widens_with_it():
    assert interval([100.0, 100.0]) == pytest.approx((100.0, 100.0))
    lo, hi = interval([50.0, 200.0])
    assert lo < 50.0 and hi > 200.0
    lo2, hi2 = interval([80.0, 125.0])
    assert lo < lo2 < 80.0 and 125.0 < hi2 < hi
    assert interval([7.0]) == pytest.approx((7.0, 7.0))
    # a known spread of its own widens it, also for samples that agree
    lo3, hi3 = interval([100.0, 100.0], known_sd=0.4)
    assert lo3 == pytest.approx(100.0 * math.exp(-1.6449 * 0.4)) and hi3 == pytest.approx(
        100.0 * math.exp(1.6449 * 0.4)
    )
    lo4, hi4 = interval([50.0, 200.0], known_sd=0.4)
    assert lo4 < lo and hi4 > hi


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


def test_the_step_levels_span_the_planners_known_error_around_its_bias():
    got = levels(1.4, 0.4, 4)
    assert got == sorted(got) and len(got) == 4
    assert math.sqrt(got[0] * got[-1]) == pytest.approx(1.4) and math.sqrt(got[1] * got[2]) == pytest.approx(1.4)
    assert got[0] < 1.0 < 1.4 < got[-1]  # the band reaches both sides of the planner's own step
    assert levels(1.4, 0.0, 3) == pytest.approx([1.4] * 3)  # no spread: every surface at the bias


def test_a_surfaces_level_scales_every_step_and_no_peak():
    composed = compose(SMALL_1K)
    cfg = composed.cfg
    from orchestrator.search.env import PlanEnv

    st = cfg.required_stage()
    env = PlanEnv(cfg.model, cfg.hardware, st, cfg.workload.name, cfg.workload.recipe)
    layout = env.plan()[0].layout
    base, slow = SampledSurface.draw(7), SampledSurface.draw(7, level=2.0)
    assert base.factors == slow.factors and base.factors["compute"] == 1.0  # the level is the surface's own
    step, probe, gb, cap = base.truth(cfg, layout)
    step2, probe2, gb2, cap2 = slow.truth(cfg, layout)
    assert step2 == pytest.approx(2 * step) and probe2 == pytest.approx(2 * probe)
    assert gb2 == gb and cap2 == cap


@pytest.mark.long
def test_the_price_moves_with_the_planners_known_bias():
    """A planner known to run fast (measured / predicted step 2) prices the same sweep dearer than one taken at
    its word, and a known spread widens the range."""
    prices = {}
    for bias, sd in ((1.0, 0.0), (2.0, 0.0), (1.0, 0.5)):
        composed = compose([*SMALL_1K, f"stage.budget.price_step_bias={bias}", f"stage.budget.price_step_sd={sd}"])
        prices[bias, sd] = price(composed.cfg, composed.to_yaml(), samples=2)
    at_word, fast, spread = prices[1.0, 0.0], prices[2.0, 0.0], prices[1.0, 0.5]
    assert fast.gpu_hours > 1.3 * at_word.gpu_hours and fast.lo > at_word.lo and fast.hi > at_word.hi
    assert spread.hi / spread.lo > at_word.hi / at_word.lo
