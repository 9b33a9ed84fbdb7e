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
    uncalibrated model puts both over HBM and predicts `pruned` the heavier (it differs in VPP or dispatcher,
    which the knob order leaves out), so calibrating on `ran` alone still prunes it."""
    cfg = compose(["+stage=1k", "cluster=local", *lib.FIXED_MEGATRON]).cfg
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
    hw = dataclasses.replace(cfg.hardware, hbm_gb=float("inf"))
    legal = planner.plan(cfg.model, hw, cfg.stage, workload=cfg.workload.name).candidates
    over = [c for c in legal if not env.fits(c.prediction.memory_gb)]
    kept = {c.key for c in env.plan()}
    for ran in over:
        for c in over:
            if (
                c.key != ran.key
                and needs_more_memory(ran.layout, c.layout)
                and c.prediction.memory_gb > 1.05 * ran.prediction.memory_gb
            ):
                assert c.key not in kept  # the model prunes it
                return cfg, env, ran, c
    raise AssertionError("no pair of pruned layouts ordered by needs_more_memory at 1k")


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
    policy = make_policy(dataclasses.replace(cfg.policy, name="calibrated_neighbours"))
    inp = RoundInput(round=1, observations=[row], known_keys={row.key}, slots=10_000, gpu_hours_left=1e12)
    fit = policy.fit(env, inp)
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
    policy = make_policy(dataclasses.replace(cfg.policy, name="calibrated_neighbours"))
    inp = RoundInput(round=1, observations=[row], known_keys={row.key}, slots=100, gpu_hours_left=1e12)
    fit = policy.fit(env, inp)
    sched = Schedule(dataclasses.replace(cfg.policy, probes_per_round=10_000))
    probed = {p.key for p in sched.probes(env, inp, fit, 1.0, set())}
    assert pruned.key not in probed
