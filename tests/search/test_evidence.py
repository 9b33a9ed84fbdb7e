"""Reasoning from what ran: a layout that needs no more memory than one measured to fit is never pruned by the
memory model (select.fit_dominated, the knob order `needs_more_memory`), not probed, and proposed."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config import compose
from orchestrator.plan import planner
from orchestrator.search import make_policy
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import fit_dominated, needs_more_memory
from orchestrator.search.types import Observation, RoundInput
from tests.bench import searchlib as lib


@pytest.fixture(scope="module")
def setting():
    """The 1k stage, and a pair (ran, pruned): `pruned` needs no more memory than `ran` by the knob order, the
    uncalibrated model puts both over HBM and predicts `pruned` the heavier (deeper PP at the same VPP keeps
    more microbatch-chunks in flight, or another dispatcher: what the knob order leaves to the model), so
    calibrating on `ran` alone still prunes it. Of such pairs, the one whose `pruned` is predicted fastest
    next to its `ran`: a neighbour the searcher finds worth measuring."""
    cfg = compose(["+stage=1k", "cluster=local", *lib.FIXED_MEGATRON]).cfg
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
    hw = dataclasses.replace(cfg.hardware, hbm_gb=float("inf"))
    legal = planner.plan(cfg.model, hw, cfg.stage, workload=cfg.workload.name).candidates
    over = [c for c in legal if not env.fits(c.prediction.memory_gb)]
    kept = {c.key for c in env.plan()}
    pairs = [
        (ran, c)
        for ran in over
        for c in over
        if c.key != ran.key
        and needs_more_memory(ran.layout, c.layout)
        and c.prediction.memory_gb > 1.05 * ran.prediction.memory_gb
    ]
    assert pairs, "no pair of pruned layouts ordered by needs_more_memory at 1k"
    ran, c = min(pairs, key=lambda p: p[1].prediction.step_time_s / p[0].prediction.step_time_s)
    assert c.key not in kept  # the model prunes it
    return cfg, env, ran, c


def _ran(planned, *, step=1.0, peak=136.0) -> Observation:
    raw = planned.prediction
    return Observation(
        key=planned.key,
        layout=planned.layout,
        raw_components=dict(raw.step_components),
        raw_step_s=raw.step_time_s,
        raw_memory_gb=raw.memory_gb,
        step_s=step,
        peak_gb=peak,
        hbm_gb=141.0,
        raw_memory_terms=tuple(raw.memory_terms_by_stage),
    )


def _calibrated(cfg, env, row: Observation, slots: int = 100):
    """calibrated_neighbours after one measured row: the policy, its round input and its calibration."""
    policy = make_policy(dataclasses.replace(cfg.policy, name="calibrated_neighbours"))
    inp = RoundInput(round=1, observations=[row], known_keys={row.key}, slots=slots, gpu_hours_left=1e12)
    return policy, inp, policy.fit(env, inp)


def test_a_layout_dominated_by_a_measured_fit_is_never_pruned(setting):
    cfg, env, ran, pruned = setting
    row = _ran(ran)
    assert fit_dominated(pruned.layout, [row]) and not fit_dominated(pruned.layout, [])
    # an OOM is no evidence of fitting
    assert not fit_dominated(pruned.layout, [dataclasses.replace(row, step_s=None, peak_gb=None, failure_class="OOM")])
    keys = [c.key for c in env.plan_with_evidence(None, 1.0, lambda lay: fit_dominated(lay, [row]))]
    assert pruned.key in keys and pruned.key not in [c.key for c in env.plan()]
    # the calibrated searcher keeps it among what it may propose, whatever its memory model says: asked for
    # every layout it would measure next, it proposes the pruned one
    policy, inp, fit = _calibrated(cfg, env, row, slots=10_000)
    assert fit is not None and not env.fits(
        env.evaluate_unchecked(pruned.layout, fit.factors, fit.memory_scale).prediction.memory_gb
    ), "the calibrated model must still prune it for this test to say anything"
    props = policy.propose(env, inp, size=2_000, fit=fit)
    assert pruned.key in [p.key for p in props]
    p = next(p for p in props if p.key == pruned.key)
    assert "known to fit" in p.reason


def test_a_layout_known_to_fit_is_not_fit_probed(setting):
    """A probe answers what no evidence covers: a layout the knob order already places under a measured fit
    gets none."""
    from orchestrator.schedule import Schedule

    cfg, env, ran, pruned = setting
    row = _ran(ran)
    _, inp, fit = _calibrated(cfg, env, row)
    sched = Schedule(dataclasses.replace(cfg.policy, probes_per_round=10_000))
    probed = {p.key for p in sched.probes(env, inp, fit, 1.0, set())}
    assert pruned.key not in probed


def test_fit_probes_go_where_the_searcher_sees_promise(setting):
    """The schedule probes the pruned layouts its searcher rates best (Policy.estimate), not those the calibrated
    step alone rates best: on twin:overpredicted the optimum's calibrated step was 28% over the best measured
    (out of the probes' reach) while calibrated_neighbours' optimistic bound put it 12% under."""
    from orchestrator.schedule import Schedule
    from orchestrator.search.moves import fit_residual, optimistic

    cfg, env, ran, _ = setting
    row = _ran(ran)
    policy, inp, fit = _calibrated(cfg, env, row)
    sched = Schedule(dataclasses.replace(cfg.policy, probes_per_round=1))
    band = [
        c
        for c in env.memory_band(fit, fit.factors)
        if not c.prediction.feasible and not fit_dominated(c.layout, [row]) and c.key != row.key
    ]
    assert len(band) >= 2, "the test needs at least two pruned layouts inside the memory model's error band"
    slowest = max(band, key=lambda c: c.prediction.step_time_s)
    fastest = min(band, key=lambda c: c.prediction.step_time_s)
    best_step = fastest.prediction.step_time_s  # the slowest one's calibrated step is out of the probes' reach
    assert slowest.prediction.step_time_s > best_step * (1 + cfg.policy.max_predicted_loss)
    (plain,) = sched.probes(env, inp, fit, best_step, set())
    assert plain.key == fastest.key  # as the calibrated step rates them

    def rate(layout, step_s):  # a searcher that sees the slowest as the most promising
        return 0.5 * best_step if layout == slowest.layout else 2.0 * step_s

    (rated,) = sched.probes(env, inp, fit, best_step, set(), rate)
    assert rated.key == slowest.key and rated.fidelity == "probe"
    # nothing the searcher rates out of reach is probed, however the calibrated step rates it
    assert sched.probes(env, inp, fit, best_step, set(), lambda lay, s: 10.0 * best_step) == []
    # calibrated_neighbours rates by the optimistic bound its proposals rank by
    res = fit_residual([row], lambda r: fit.predict(r.raw_components))
    bound = policy.estimate(inp, fit)
    assert bound(slowest.layout, 50.0) == pytest.approx(
        optimistic(50.0, *res.predict(slowest.layout), cfg.policy.explore)
    )
    assert policy.estimate(inp, None)(slowest.layout, 50.0) == 50.0  # uncalibrated: the prediction as it is
