"""Per-term memory calibration (orchestrator/search/memfit.py): recovers per-term factors from per-stage
rows, falls back to one ratio, learns from OOMs, gives an error band; and on the twin's `memory` surface a
layout the uncalibrated model prunes is revived by calibration and measured by the real decision loop."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from orchestrator.config import compose
from orchestrator.core.states import EventKind
from orchestrator.plan.layout import Layout
from orchestrator.plan.memory import TERMS
from orchestrator.search import memfit
from orchestrator.search.calibrate import Fit, calibrate, memory_estimate, within_band
from orchestrator.search.env import PlanEnv
from orchestrator.search.types import Observation

HIDDEN = {"states": 1.0, "activations": 0.4, "buffers": 1.5}


def _layout_rows(n: int, *, seed: int = 0, noise: float = 0.0, hidden=HIDDEN, pp: int = 4) -> list[Observation]:
    """n measured layouts, each with pp stages whose raw terms vary (activations fall along the pipeline, as
    1F1B keeps fewer microbatches alive on later ranks) and a per-stage peak from the hidden factors."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        states, act, buf = rng.uniform(30, 60), rng.uniform(40, 160), rng.uniform(4, 10)
        terms = tuple(
            {"states": states * rng.uniform(0.9, 1.1), "activations": act * (pp - s) / pp, "buffers": buf}
            for s in range(pp)
        )
        peaks = {s: sum(hidden[k] * v for k, v in t.items()) * (1 + rng.gauss(0, noise)) for s, t in enumerate(terms)}
        raw = max(sum(t.values()) for t in terms)
        out.append(
            Observation(
                key=f"k{i}",
                layout=Layout(ep=2 ** (i % 4)),
                raw_components={"compute": 1.0},
                raw_step_s=1.0,
                raw_memory_gb=raw,
                step_s=1.0,
                peak_gb=max(peaks.values()),
                hbm_gb=141.0,
                raw_memory_terms=terms,
                stage_peaks_gb=peaks,
            )
        )
    return out


def test_per_term_fit_recovers_hidden_factors_that_one_ratio_cannot():
    rows = _layout_rows(8, noise=0.005)
    fit = calibrate(rows, hbm_gb=141.0, margin_gb=4.0)
    assert fit.memory_method == "terms"
    for t in ("states", "activations"):
        assert fit.memory_factors[t] == pytest.approx(HIDDEN[t], rel=0.15), t
    # buffers are ~5% of a peak: the pull toward 1 keeps part of their analytic value, but they move the right way
    assert 1.0 < fit.memory_factors["buffers"] <= HIDDEN["buffers"]
    assert set(fit.memory_factors) == set(TERMS)
    assert fit.memory_mape_after < 0.03 < fit.memory_mape_before
    assert fit.memory_loo_mape is not None and fit.memory_loo_mape < 0.05
    assert memfit.MIN_BAND <= fit.memory_band < 0.1


def test_each_recompute_set_gets_its_own_activation_multiplier():
    """Selective recompute keeps different tensors than full recompute, so their activation estimates err by
    different factors; one shared factor leaves both ~30% off, per-set multipliers fit both."""
    full = _layout_rows(5, seed=1, hidden={"states": 1.0, "activations": 0.8, "buffers": 1.0})
    sel = _layout_rows(5, seed=2, hidden={"states": 1.0, "activations": 0.3, "buffers": 1.0})
    rows = [Observation(**{**r.__dict__, "key": f"f{r.key}", "layout": Layout(recompute=("full",))}) for r in full]
    rows += [Observation(**{**r.__dict__, "key": f"s{r.key}", "layout": Layout(recompute=("mhc",))}) for r in sel]
    fit = calibrate(rows, hbm_gb=141.0, margin_gb=4.0)
    assert fit.memory_method == "terms+sets"
    assert {"activations@full", "activations@mhc"} <= set(fit.memory_factors)
    act = fit.memory_factors["activations"]
    assert act * fit.memory_factors["activations@full"] == pytest.approx(0.8, rel=0.2)
    assert act * fit.memory_factors["activations@mhc"] == pytest.approx(0.3, rel=0.2)
    assert fit.memory_mape_after < 0.03
    # the planner's scaling reads the same keys; a set never measured is assumed to err upward as far as the
    # measured sets differ ("activations@*"): not revived on a guess
    terms = ({"states": 50.0, "activations": 100.0, "buffers": 5.0},)
    assert memory_estimate(fit, terms, ("mhc",)).peak_gb < memory_estimate(fit, terms, ("full",)).peak_gb
    spread = max(abs(fit.memory_factors[k] - 1) for k in ("activations@full", "activations@mhc"))
    assert fit.memory_factors["activations@*"] == pytest.approx(1 + spread)
    unseen = memory_estimate(fit, terms, ("moe_act",)).peak_gb
    f = fit.memory_factors
    assert unseen == pytest.approx(50 * f["states"] + 100 * act * (1 + spread) + 5 * f["buffers"])


def test_few_layouts_fall_back_to_one_ratio():
    rows = _layout_rows(memfit.MIN_LAYOUTS - 1)
    fit = calibrate(rows, hbm_gb=141.0, margin_gb=4.0)
    assert fit.memory_method == "ratio"
    assert len(set(fit.memory_factors.values())) == 1
    assert fit.memory_factors["activations"] == pytest.approx(fit.memory_factor)


def test_an_oom_is_a_lower_bound_that_pulls_the_fit_up():
    """An OOMed layout the measured rows alone predict under HBM joins the fit just over HBM: its prediction
    rises toward HBM, while the layouts that ran keep their say (a pull, not a hard constraint)."""
    rows = _layout_rows(6, noise=0.0)
    plain = calibrate(rows, hbm_gb=141.0, margin_gb=4.0)
    big = tuple({"states": 40.0, "activations": 200.0, "buffers": 6.0} for _ in range(2))
    before = memfit.peak(big, plain.memory_factors)[0]
    assert before < 141.0  # the per-term fit alone says it fits
    oom = Observation(
        key="oom",
        layout=Layout(ep=64),
        raw_components={"compute": 1.0},
        raw_step_s=1.0,
        raw_memory_gb=246.0,
        failure_class="OOM",
        raw_memory_terms=big,
    )
    fit = calibrate([*rows, oom], hbm_gb=141.0, margin_gb=4.0)
    assert fit.memory_method == "terms"
    assert memfit.peak(big, fit.memory_factors)[0] > before + 1.0
    assert fit.memory_mape_after < 0.1
    # an OOM the fit already puts over HBM changes nothing
    small = Observation(**{**oom.__dict__, "raw_memory_terms": tuple(dict(t, activations=600.0) for t in big)})
    assert calibrate([*rows, small], hbm_gb=141.0, margin_gb=4.0).memory_factors == plain.memory_factors


def test_an_oom_of_a_recompute_set_nothing_measured_moves_only_that_sets_multiplier():
    """Issue 19's `mixed` s112: the layouts that ran all used full recompute; selective-recompute layouts OOMed.
    Those OOMs say the selective set keeps more than estimated, not that the states or full recompute's
    activations do: the measured rows' fit stays as it was, the OOM's set alone is pulled up to HBM."""
    full = [
        Observation(**{**r.__dict__, "layout": Layout(ep=r.layout.ep, recompute=("full",))}) for r in _layout_rows(6)
    ]
    plain = calibrate(full, hbm_gb=141.0, margin_gb=4.0)
    big = tuple({"states": 40.0, "activations": 200.0, "buffers": 6.0} for _ in range(2))
    oom = Observation(
        key="oom",
        layout=Layout(ep=64, recompute=("mhc",)),
        raw_components={"compute": 1.0},
        raw_step_s=1.0,
        raw_memory_gb=246.0,
        failure_class="OOM",
        raw_memory_terms=big,
    )
    assert memfit.peak(big, plain.memory_factors, ("mhc",))[0] < 141.0  # the measured rows alone say it fits
    fit = calibrate([*full, oom], hbm_gb=141.0, margin_gb=4.0)
    assert fit.memory_method == "terms"
    assert {t: fit.memory_factors[t] for t in TERMS} == plain.memory_factors
    assert fit.memory_factors["activations@mhc"] > 1.0 and "activations@full" not in fit.memory_factors
    assert memfit.peak(big, fit.memory_factors, ("mhc",))[0] == pytest.approx(141.0 * memfit.OOM_OVER, rel=0.02)
    for r in full:  # the layouts that ran are predicted as before
        before = memfit.peak(r.raw_memory_terms, plain.memory_factors, ("full",))[0]
        assert memfit.peak(r.raw_memory_terms, fit.memory_factors, ("full",))[0] == pytest.approx(before)
    # a set neither measured nor OOMed keeps the shared factors
    unseen = memfit.peak(big, fit.memory_factors, ("moe_act",))[0]
    assert unseen == pytest.approx(memfit.peak(big, plain.memory_factors)[0])


def test_band_predicate_and_estimate():
    terms = ({"states": 50.0, "activations": 100.0, "buffers": 10.0},)
    fit = Fit(method="none", memory_method="terms", memory_factors=dict(HIDDEN), memory_band=0.1)
    est = memory_estimate(fit, terms)
    assert est.raw_gb == pytest.approx(160.0)
    assert est.peak_gb == pytest.approx(50 + 40 + 15)
    assert (est.lo_gb, est.hi_gb) == pytest.approx((105 * 0.9, 105 * 1.1))
    assert within_band(est, hbm_gb=110.0, margin_gb=4.0)  # 94.5 .. 115.5 straddles 106 usable / 110 HBM
    assert not within_band(est, hbm_gb=141.0, margin_gb=4.0)  # surely fits
    assert est.surely_fits(hbm_gb=141.0, margin_gb=4.0)
    assert not within_band(est, hbm_gb=80.0, margin_gb=4.0) and est.surely_ooms(hbm_gb=80.0)  # lo 94.5 > 80
    # no fit yet: the default band around the raw model
    raw = memory_estimate(None, terms)
    assert raw.peak_gb == pytest.approx(160.0) and raw.hi_gb == pytest.approx(160 * (1 + memfit.DEFAULT_BAND))


def test_the_planner_applies_per_term_factors_to_every_stage():
    c = compose(["+stage=1k", "cluster=local"]).cfg
    env = PlanEnv(c.model, c.hardware, c.stage, c.workload.name)
    lay = env.plan()[0].layout
    raw = env.evaluate_unchecked(lay, None, 1.0).prediction
    scale = {"states": 1.0, "activations": 0.5, "buffers": 2.0}
    cal = env.evaluate_unchecked(lay, None, scale).prediction
    want = [sum(scale[k] * v for k, v in t.items()) for t in raw.memory_terms_by_stage]
    assert list(cal.memory_by_stage) == pytest.approx(want)
    assert cal.memory_gb == pytest.approx(max(want))
    assert [sum(t.values()) for t in raw.memory_terms_by_stage] == pytest.approx(list(raw.memory_by_stage))
    # a float still scales every term alike
    assert env.evaluate_unchecked(lay, None, 0.5).prediction.memory_gb == pytest.approx(raw.memory_gb * 0.5)


# ------------------------------------------------------------------------------ revival on the twin
BENCH = Path(__file__).resolve().parent.parent / "bench"
SEED = 3  # twin:memory seed whose true best is a selective-recompute layout the raw model prunes


@pytest.fixture(scope="module")
def searchlib():
    sys.path.insert(0, str(BENCH))
    try:
        import searchlib as lib

        yield lib
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def memory_sweep(searchlib, tmp_path_factory):
    """One 1k sweep on twin:memory through the real decision loop (tests/bench/searchlib.run_sweep)."""
    lib = searchlib
    target = lib.Target("twin:memory", SEED)
    composed = compose(["+stage=1k", "cluster=local", "policy.name=calibrated_neighbours", *target.overrides()])
    grid = lib.build_grid(composed.cfg, target, startup_s=300.0)
    ledger = lib.fresh_ledger(str(tmp_path_factory.mktemp("memory-sweep")))
    run = lib.run_sweep(ledger, composed, target, "revive", startup_s=300.0)
    return composed.cfg, grid, ledger, run


@pytest.mark.long
def test_a_layout_the_uncalibrated_model_prunes_is_revived_and_measured(memory_sweep):
    """twin:memory activations are over-predicted 2-3x: the true best does not fit by the raw planner, so
    round 0 cannot see it. After other layouts are measured, per-term calibration says it fits, the
    policy proposes it marked 'revived', and the real decision loop measures it."""
    cfg, grid, ledger, run = memory_sweep
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
    best = grid.layouts[grid.best]
    assert env.evaluate(best) is None, "the uncalibrated model must prune the true best"
    assert env.evaluate_unchecked(best, None, 1.0).prediction.memory_gb + 4.0 > cfg.hardware.hbm_gb

    kept = {c.key for c in env.plan()}  # what the uncalibrated model lets a search see
    best_kept = min(float(t) for k, t in zip(grid.keys, grid.true_s) if k in kept)
    assert grid.best_s < best_kept * 0.9  # the optimum hides where the raw model cannot look

    measured = {x[1].short(): x[3] for x in run.launches}  # (round, layout, GPU-h, p50, true step, ...)
    revived = [c for c in ledger.candidates("revive") if c.predicted.revived]
    ran = [c for c in revived if measured.get(c.layout.short()) is not None]
    assert ran, "a revived layout was launched and measured"
    for c in revived:
        lay = c.layout
        assert env.evaluate(lay) is None, f"{lay.short()} was not pruned by the uncalibrated model"
        assert c.predicted["revived"]["raw_memory_gb"] + 4.0 > cfg.hardware.hbm_gb
        assert c.predicted["revived"]["calibrated_memory_gb"] + 4.0 <= cfg.hardware.hbm_gb
        # why it was proposed: its round's event (a round's plain line carries counts, the event each layout's why)
        why = next(
            reason
            for e in ledger.events("revive", kind=EventKind.ROUND)
            for key, reason in zip((e.data or {}).get("keys") or (), (e.data or {}).get("reasons") or ())
            if key == c.key
        )
        assert "revived: pruned by the uncalibrated memory model" in why, why
    # the sweep reports a revived layout, better than anything the uncalibrated model could have let it run
    assert run.reported is not None
    reported = ledger.candidate_by_key("revive", observe_best_key(ledger))
    assert (reported.predicted or {}).get("revived")
    assert run.reported_true_s < best_kept * 0.9
    # the calibration the ledger recorded is per term and has moved activations down
    fits = [c.fit for c in ledger.evidence.calibrations("revive")]
    assert fits and fits[-1]["memory_method"].startswith("terms") and fits[-1]["memory_factors"]["activations"] < 0.8
    # the search path (status, report) marks exactly the revived proposals
    from orchestrator.report import path

    rows = path.gather(ledger, "revive")
    assert {r["key"] for r in rows if r["revived"]} == {c.key for c in revived}
    assert "revived (pruned by the uncalibrated memory model" in path.fragment(rows)


def observe_best_key(ledger) -> str:
    from orchestrator import history

    best = history.best_of(ledger, "revive")
    assert best is not None
    return best["key"]


@pytest.mark.long
def test_report_plots_the_uncalibrated_prediction_off_the_diagonal(memory_sweep):
    """The report's predicted-vs-measured points use the UNcalibrated planner against the measurement: on a
    surface the planner gets wrong they are off the diagonal (the calibrated series sits closer)."""
    from orchestrator.report import data, plots

    _, _, ledger, _ = memory_sweep
    d = data.gather(ledger, "revive")
    pts = data.predicted_vs_measured(d.measured)
    assert len(pts) >= 6 and all(p["raw_step_s"] and p["raw_memory_gb"] for p in pts)
    step_err = sorted(abs(p["raw_step_s"] / p["step_s"] - 1) for p in pts)
    mem_err = sorted(abs(p["raw_memory_gb"] / p["memory_gb"] - 1) for p in pts)
    assert step_err[len(step_err) // 2] > 0.05, step_err
    assert mem_err[len(mem_err) // 2] > 0.15, mem_err  # activations 2-3x off
    later = [p for p in pts if p["round"] > 0]
    cal_err = sorted(abs(p["cal_memory_gb"] / p["memory_gb"] - 1) for p in later)
    raw_err = sorted(abs(p["raw_memory_gb"] / p["memory_gb"] - 1) for p in later)
    assert cal_err[len(cal_err) // 2] < raw_err[len(raw_err) // 2]
    png = plots.calibration(d)
    assert png is not None and png[:4] == b"\x89PNG"


def test_memory_band_lists_the_layouts_a_probe_should_decide():
    """PlanEnv.memory_band: the legal layouts whose calibrated band straddles HBM, each with its calibrated
    prediction; none that surely fits or surely OOMs."""
    c = compose(["+stage=1k", "cluster=local"]).cfg
    env = PlanEnv(c.model, c.hardware, c.stage, c.workload.name)
    fit = Fit(method="none", memory_method="terms", memory_factors={**HIDDEN, "buffers": 1.0}, memory_band=0.1)
    band = env.memory_band(fit)
    assert band
    hbm, margin = c.hardware.hbm_gb, c.stage.memory_margin_gb
    for p in band:
        est = memory_estimate(fit, p.prediction.memory_terms_by_stage, p.layout.recompute)
        assert within_band(est, hbm_gb=hbm, margin_gb=margin)
        assert p.prediction.memory_gb == pytest.approx(est.peak_gb)
    assert {p.prediction.feasible for p in band} == {True, False}  # both sides of the line
    kept = {p.key for p in env.plan(None, fit.memory_scale)}
    assert any(p.key in kept for p in band) and any(p.key not in kept for p in band)
