"""The composed step (orchestrator/search/compose.py): a rank probe's measured compute with the calibrated
communication; communication fitted on full runs' residuals; a probe never a step measurement."""

from __future__ import annotations

import dataclasses
import random

import pytest

from orchestrator.core.states import Fidelity
from orchestrator.plan import steptime
from orchestrator.plan.layout import Layout
from orchestrator.search import compose
from orchestrator.search.calibrate import calibrate
from orchestrator.search.select import best_measured, measured_rank
from orchestrator.search.types import Observation


def _comps(rng: random.Random) -> dict[str, float]:
    return {
        "compute": rng.uniform(20, 40),
        "a2a": rng.uniform(2, 8),
        "pp_p2p": rng.uniform(0.5, 2),
        "bubble": rng.uniform(1, 6),
        "grad_sync": rng.uniform(0.5, 2),
        "optimizer": rng.uniform(0.5, 1),
    }


def _true_step(comps: dict[str, float], compute_error: float, comm: dict[str, float]) -> tuple[float, float]:
    """(full step, what a probe of it measures) of a machine whose compute is `compute_error` x the planner's
    and whose communication is `comm[c]` x the planner's (the bubble follows the stage time)."""
    stage = sum(comps.get(c, 0.0) for c in steptime.PER_MICROBATCH)
    true_stage = comps["compute"] * compute_error + sum(comm[c] * comps[c] for c in ("a2a", "pp_p2p"))
    probe = (comps["compute"] + comps["optimizer"]) * compute_error
    step = (
        true_stage
        + comps["bubble"] * true_stage / stage
        + comm["grad_sync"] * comps["grad_sync"]
        + comps["optimizer"] * compute_error
    )
    return step, probe


def _row(i: int, comps: dict[str, float], step: float | None, probe: float | None, **kw) -> Observation:
    return Observation(
        key=f"k{i}",
        layout=Layout(ep=2 ** (i % 4), pp=1 + i % 3),
        raw_components=comps,
        raw_step_s=sum(comps.values()),
        raw_memory_gb=50.0,
        step_s=step,
        peak_gb=50.0,
        hbm_gb=80.0,
        probe_step_s=probe,
        raw_probe_s=(comps["compute"] + comps["optimizer"]) if probe else None,
        **kw,
    )


COMM = {"a2a": 1.6, "pp_p2p": 1.2, "grad_sync": 0.8}


def test_a_layout_whose_planner_compute_is_2x_off_is_predicted_right_once_probed():
    rng = random.Random(0)
    rows = []
    for i in range(10):  # full runs of layouts the planner gets right, compute-wise
        comps = _comps(rng)
        rows.append(_row(i, comps, _true_step(comps, 1.0, COMM)[0], None))
    fit = calibrate(rows, hbm_gb=80, margin_gb=4)
    comps = _comps(rng)
    true, probe = _true_step(comps, 2.0, COMM)  # a layout whose compute is twice what the planner says
    unprobed = _row(99, comps, None, None)
    probed = _row(99, comps, None, probe, fidelity=Fidelity.PROBE)
    assert abs(fit.predict_row(unprobed) / true - 1) > 0.3  # the calibrated planner alone is far off
    assert fit.predict_row(probed) == pytest.approx(true, rel=0.03)  # composed: the probe's compute
    assert probed.probe_scale == pytest.approx(2.0)


def test_the_communication_factors_are_fitted_on_the_residual_of_probed_full_runs():
    rng = random.Random(1)
    rows = []
    for i in range(16):  # every full run was probed first; compute errors differ layout by layout
        comps = _comps(rng)
        step, probe = _true_step(comps, rng.uniform(0.6, 2.0), COMM)
        rows.append(_row(i, comps, step, probe))
    fit = calibrate(rows, hbm_gb=80, margin_gb=4)
    assert fit.method == "components"
    assert fit.factors["a2a"] == pytest.approx(COMM["a2a"], rel=0.1)
    assert fit.mape_after < 0.02  # in sample, composed
    # the compute factor was never asked: every row's compute is measured (regularized to 1)
    assert fit.factors["compute"] == pytest.approx(1.0, abs=0.05)
    unprobed = [_row(i, r.raw_components, r.step_s, None) for i, r in enumerate(rows)]
    assert calibrate(unprobed, hbm_gb=80, margin_gb=4).mape_after > 0.05  # without the probes: worse


def test_the_composed_bubble_follows_the_stage_time_the_probe_measured():
    comps = {"compute": 10.0, "a2a": 10.0, "bubble": 4.0, "optimizer": 1.0}
    out = compose.components(comps, 2.0)
    assert out["compute"] == 20.0 and out["optimizer"] == 2.0 and out["a2a"] == 10.0
    assert out["bubble"] == pytest.approx(4.0 * 30.0 / 20.0)
    assert compose.components(comps, None) == comps
    fixed, rest = compose.split(comps, 2.0)
    assert fixed == 22.0 and set(rest) == {"a2a", "bubble"}


def test_a_probe_row_is_never_a_best_nor_a_full_window_measurement():
    rng = random.Random(2)
    comps = _comps(rng)
    full = _row(0, comps, 50.0, None)
    probe = _row(1, comps, None, 10.0, fidelity=Fidelity.PROBE)  # far faster than anything: compute only
    assert not probe.ok
    assert best_measured([probe]) is None
    assert best_measured([full, probe]) is full
    assert measured_rank([full, probe]) == [full]
    # calibration never reads a probe's compute-only step as a full step
    assert calibrate([full, probe], hbm_gb=80, margin_gb=4).n_step == 1


def _planned_rows():
    """The 1k stage's env and its best predicted layouts as observations (raw = the planner's)."""
    from orchestrator.config import compose as compose_cfg
    from orchestrator.search.env import PlanEnv
    from tests.bench import searchlib as lib

    cfg = compose_cfg(["+stage=1k", "cluster=local", *lib.FIXED_MEGATRON]).cfg
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
    return cfg, env, env.plan()[:12]


def _observed(planned, i, *, step=None, probe=None, fidelity=Fidelity.FULL, peak=100.0) -> Observation:
    p = planned.prediction
    return Observation(
        key=planned.key,
        layout=planned.layout,
        raw_components=dict(p.step_components),
        raw_step_s=p.step_time_s,
        raw_memory_gb=p.memory_gb,
        step_s=step,
        peak_gb=peak,
        hbm_gb=141.0,
        raw_memory_terms=tuple(p.memory_terms_by_stage),
        fidelity=fidelity,
        round=i,
        probe_step_s=probe,
        raw_probe_s=p.probe_step_s if probe else None,
    )


def test_a_probed_layout_is_measured_at_scale_only_when_its_composed_step_is_near_the_best():
    from orchestrator.schedule.round import passed as due
    from orchestrator.search.types import RoundInput

    cfg, _, planned = _planned_rows()
    ran = [_observed(c, 0, step=c.prediction.step_time_s) for c in planned[:4]]
    best = min(r.measured_step_s for r in ran)
    fit = calibrate(ran, hbm_gb=141.0, margin_gb=cfg.stage.memory_margin_gb)
    fast, slow = planned[4], planned[5]
    # the same planner prediction; the probes say one computes as predicted, the other twice as slow
    probed = [
        _observed(fast, 1, probe=fast.prediction.probe_step_s, fidelity=Fidelity.PROBE),
        _observed(slow, 1, probe=2.0 * slow.prediction.probe_step_s, fidelity=Fidelity.PROBE),
    ]
    assert all(r.probed_fit and not r.ok for r in probed)  # known to fit, no step measured
    inp = RoundInput(round=2, observations=ran + probed, known_keys=set(), slots=6, gpu_hours_left=1e9)
    passed = {r.key for r, _ in due(cfg.policy, inp, fit)}
    assert fit.predict_row(probed[1]) > best * (1 + cfg.policy.schedule.probe_pass)
    assert slow.key not in passed
    assert (fast.key in passed) == (fit.predict_row(probed[0]) <= best * (1 + cfg.policy.schedule.probe_pass))
    # nothing calibrated yet: every layout a probe found to fit is measured (as before composed steps)
    assert {r.key for r, _ in due(cfg.policy, inp, None)} == {fast.key, slow.key}


def test_a_probed_layout_holds_convergence_on_its_composed_step_as_the_layouts_probed_before_it_bore_it_out():
    """Layouts rank-probed and then screened at scale ran 40% over their composed steps: a probed layout whose
    composed step is at the best no longer holds the sweep open (Schedule.waiting), though a round that runs anyway
    still measures it (the confirm step reads its composed step as it is). Where the same pairs ran 20% under
    theirs, nothing changes: the bias only ever lifts the composed step (the searcher's rating already lowers it
    where knob values measured faster). Without such a pair the composed step is taken as it is."""
    from types import SimpleNamespace

    from orchestrator.config import compose as compose_cfg
    from orchestrator.schedule import Schedule
    from orchestrator.schedule.round import passed as due
    from orchestrator.search.types import RoundInput

    policy = compose_cfg(["+stage=1k", "cluster=local"]).cfg.policy
    composed = {0: 100.0, 1: 100.0, 2: 100.0, 3: 115.0}  # what the stub fit composes, per layout (its compute)
    fit = SimpleNamespace(
        predict=lambda comps, scale=None: composed[int(comps["compute"])],
        predict_row=lambda r: composed[int(r.raw_components["compute"])],
    )

    def row(i: int, **kw) -> Observation:
        return dataclasses.replace(_row(i, {"compute": float(i), "optimizer": 0.0}, None, None), **kw)

    best = row(0, step_s=100.0)
    probed = [row(i, fidelity=Fidelity.PROBE, probe_step_s=2.0, raw_probe_s=2.0) for i in (2, 3)]

    def inp(pair_step: float | None) -> RoundInput:
        # a screen (no best): what the probe's pair ran at scale, never the best it is held against
        pair = row(1, step_s=pair_step, earlier_probe_s=2.0, raw_probe_s=2.0, fidelity=Fidelity.SCREEN, measure_iters=5)
        rows = [best, *([] if pair_step is None else [pair]), *probed]
        bias = compose.scale_bias(rows, fit.predict)
        assert bias == (1.0 if pair_step is None else max(1.0, pair_step / 100.0))
        return RoundInput(round=2, observations=rows, known_keys=set(), slots=6, gpu_hours_left=1e9)

    def holding(pair_step: float | None) -> set[str]:
        return {r.key for r, _ in due(policy, inp(pair_step), fit, holding=True)}  # type: ignore[arg-type]

    assert holding(None) == {"k2"}  # 100 s composed passes a 100 s best, 115 s does not (probe_pass 5%)
    assert holding(140.0) == set() and holding(80.0) == {"k2"}
    assert not Schedule(policy).waiting(inp(140.0), fit)  # type: ignore[arg-type]
    assert Schedule(policy).waiting(inp(None), fit)  # type: ignore[arg-type]
    assert {r.key for r, _ in due(policy, inp(140.0), fit)} == {"k2"}  # type: ignore[arg-type]  # measured if a round runs
    # a layout measured at scale without a probe before it, or only partly, says nothing of the composition
    assert row(1, step_s=140.0).earlier_probe_scale is None
    cut_short = row(1, step_s=140.0, earlier_probe_s=2.0, raw_probe_s=2.0, partial=True)
    assert compose.scale_bias([cut_short], fit.predict) == 1.0


@pytest.mark.long
def test_after_round_0_the_searchers_proposals_beyond_its_first_few_are_probed_first():
    from orchestrator.schedule import Schedule
    from orchestrator.search.types import RoundInput

    cfg, env, planned = _planned_rows()
    ran = [_observed(c, 0, step=c.prediction.step_time_s) for c in planned[:4]]
    inp = RoundInput(
        round=1,
        observations=ran,
        known_keys={r.key for r in ran},
        slots=10,
        gpu_hours_left=1e9,
    )
    from orchestrator.search import make_policy

    sched = cfg.policy.schedule  # of the round's 4: 1 at scale, 3 probed
    first = dataclasses.replace(sched.probe_first, direct_per_round=1)
    policy = dataclasses.replace(cfg.policy, schedule=dataclasses.replace(sched, probe_first=first))
    plan = Schedule(policy).plan(make_policy(policy), env, inp)
    new = [p for p in plan.proposals if not p.reason.startswith("fit-probe")]
    direct = [p for p in new if p.fidelity != Fidelity.PROBE]
    first = [p for p in new if "probe first" in p.reason]
    assert len(direct) == 1
    assert first and all(p.fidelity == Fidelity.PROBE and p.probe_ranks for p in first)
    assert all(p.probe_ranks[-1] == cfg.stage.gpus - 1 for p in first)  # the last rank: it prints the step
    full_h = env.gpu_hours(first[0].predicted_step_s)
    assert all(p.est_gpu_hours < full_h / 100 for p in first)  # one GPU per probed rank, a short window
