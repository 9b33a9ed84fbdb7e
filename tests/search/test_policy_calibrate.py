"""Calibration on synthetic measured rows: recovers hidden factors, falls back, learns from OOMs."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.plan.layout import Layout
from orchestrator.plan.steptime import scaled
from orchestrator.search.calibrate import calibrate, memory_factor
from orchestrator.search.nnls import nnls
from orchestrator.search.types import Observation

COMPS = ("compute", "a2a", "bubble", "grad_sync")


def _rows(truth, n, *, seed=0, noise=0.0, mem_truth=1.0):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        comps = {
            "compute": rng.uniform(5, 10),
            "a2a": rng.uniform(0.5, 4),
            "bubble": rng.uniform(0.2, 3),
            "grad_sync": rng.uniform(0.1, 1),
        }
        raw = sum(comps.values())
        meas = sum(scaled(comps, truth).values()) * (1 + rng.gauss(0, noise))  # the bubble follows the stage
        mem = rng.uniform(20, 60)
        rows.append(
            Observation(
                key=f"k{i}",
                layout=Layout(ep=2 ** (i % 4)),
                raw_components=comps,
                raw_step_s=raw,
                raw_memory_gb=mem,
                step_s=meas,
                p99_s=meas * 1.1,
                peak_gb=mem * mem_truth,
                round=i // 4,
                hbm_gb=80.0,
            )
        )
    return rows


def test_nnls_matches_unconstrained_when_solution_positive():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, (20, 4))
    x_true = np.array([1.0, 2.0, 0.5, 3.0])
    assert np.allclose(nnls(a, a @ x_true), x_true, atol=1e-8)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=3, max_size=3), st.integers(0, 1000))
def test_nnls_is_nonnegative_and_not_worse_than_clipping(x_true, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, (10, 3))
    b = a @ np.array(x_true)
    x = nnls(a, b)
    assert (x >= 0).all()
    clipped = np.clip(np.linalg.lstsq(a, b, rcond=None)[0], 0, None)
    assert np.linalg.norm(a @ x - b) <= np.linalg.norm(a @ clipped - b) + 1e-9


def test_components_fit_recovers_hidden_factors_and_lowers_error():
    truth = {"compute": 1.2, "a2a": 2.0, "bubble": 1.0, "grad_sync": 1.0}
    fit = calibrate(_rows(truth, 16), hbm_gb=80, margin_gb=4)
    assert fit.method == "components"
    assert fit.factors["compute"] == pytest.approx(1.2, rel=0.05)
    assert fit.factors["a2a"] == pytest.approx(2.0, rel=0.1)
    assert fit.mape_before > 0.15 and fit.mape_after < 0.02


def _uniform(x: float) -> dict[str, float]:
    """A machine x times the planner everywhere: every component x, the bubble through its stage time."""
    return {c: 1.0 if c == "bubble" else x for c in COMPS}


def test_few_rows_fall_back_to_a_single_ratio():
    fit = calibrate(_rows(_uniform(1.3), 2), hbm_gb=80, margin_gb=4)
    assert fit.method == "ratio"
    assert fit.factors == pytest.approx(_uniform(1.3))  # the bubble keeps 1: it follows the scaled stage time
    assert fit.mape_after == pytest.approx(0.0, abs=1e-9)


def test_uniform_scaling_prefers_ratio_or_matches_it():
    truth = _uniform(0.8)
    fit = calibrate(_rows(truth, 12, noise=0.02), hbm_gb=80, margin_gb=4)
    assert all(v == pytest.approx(truth[c], rel=0.15) for c, v in fit.factors.items())
    assert fit.mape_after < 0.05


def test_fitted_on_shallow_pipelines_a_deep_pipelines_bubble_follows_the_calibrated_stage_time():
    """The planner's stage time is 2x what the machine runs; every measured layout has a small bubble (PP4 at
    many microbatches), so the bubble's own factor is barely seen. A deep pipeline's bubble is the stage time x
    f / (1 - f): it must come out at the calibrated stage time, not the raw one (docs/search.md)."""
    truth = {"compute": 0.5, "a2a": 0.5, "bubble": 1.0, "grad_sync": 1.0}
    rng = random.Random(3)
    rows = []
    for i in range(8):
        comps = {"compute": rng.uniform(5, 10), "a2a": rng.uniform(1, 3), "grad_sync": rng.uniform(0.1, 1)}
        comps["bubble"] = (comps["compute"] + comps["a2a"]) * rng.uniform(0.01, 0.04)
        meas = sum(scaled(comps, truth).values()) * (1 + rng.gauss(0, 0.01))
        lay = Layout(pp=4, ep=2 ** (i % 4))
        rows.append(
            Observation(
                key=f"s{i}",
                layout=lay,
                raw_components=comps,
                raw_step_s=sum(comps.values()),
                raw_memory_gb=40.0,
                step_s=meas,
                peak_gb=40.0,
                round=i // 4,
                hbm_gb=80.0,
            )
        )
    fit = calibrate(rows, hbm_gb=80, margin_gb=4)
    deep = {"compute": 8.0, "a2a": 2.0, "grad_sync": 0.5, "bubble": 10.0}  # f = 1/2: the bubble is the stage time
    true_step = 0.5 * 10.0 + 0.5 + 0.5 * 10.0  # its bubble at the machine's stage time, 5 s
    assert fit.predict(deep) == pytest.approx(true_step, rel=0.05)
    assert fit.predict(deep) < 0.5 * 10.0 + 0.5 + 10.0 * 0.9  # not the raw stage time's bubble


def test_no_measurements_is_identity():
    rows = [
        Observation(
            key="a",
            layout=Layout(),
            raw_components={"compute": 1.0},
            raw_step_s=1.0,
            raw_memory_gb=10,
            failure_class="CRASH",
        )
    ]
    fit = calibrate(rows, hbm_gb=80, margin_gb=4)
    assert fit.method == "none" and fit.predict({"compute": 2.0}) == 2.0 and fit.memory_factor == 1.0


def test_memory_factor_is_median_ratio():
    rows = _rows({c: 1.0 for c in COMPS}, 9, mem_truth=1.07)
    assert memory_factor(rows, hbm_gb=80, margin_gb=4) == pytest.approx(1.07)


def test_oom_raises_memory_factor_until_the_oomed_layout_is_over_capacity():
    ok = Observation(
        key="ok",
        layout=Layout(),
        raw_components={"compute": 1},
        raw_step_s=1,
        raw_memory_gb=40,
        step_s=1.0,
        peak_gb=40.0,
    )
    oom = Observation(
        key="oom",
        layout=Layout(ep=2),
        raw_components={"compute": 1},
        raw_step_s=1,
        raw_memory_gb=70,
        failure_class="OOM",
    )
    f = memory_factor([ok, oom], hbm_gb=80, margin_gb=4)
    assert 70 * f + 4 > 80  # the OOMed layout is now predicted infeasible
    assert 40 * f + 4 <= 80  # the one that ran stays feasible


def test_oom_never_makes_a_layout_that_ran_infeasible():
    ran = Observation(
        key="ok",
        layout=Layout(),
        raw_components={"compute": 1},
        raw_step_s=1,
        raw_memory_gb=70,
        step_s=1.0,
        peak_gb=70.0,
    )
    oom = Observation(
        key="oom",
        layout=Layout(ep=2),
        raw_components={"compute": 1},
        raw_step_s=1,
        raw_memory_gb=50,
        failure_class="OOM",
    )
    f = memory_factor([ran, oom], hbm_gb=80, margin_gb=4)
    assert 70 * f + 4 <= 80 + 1e-9
