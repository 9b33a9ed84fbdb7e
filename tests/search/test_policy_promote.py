"""Promotion 1k -> 8k through the policy: measured top-K mapped at the same B, edges recorded, new fill."""

from __future__ import annotations

import pytest

from orchestrator.config import compose
from orchestrator.core.schema import PolicyConfig, ScheduleConfig, SearcherConfig
from orchestrator.plan.layout import groups
from orchestrator.schedule import Schedule
from orchestrator.search import make_policy
from orchestrator.search.env import PlanEnv
from orchestrator.search.types import Observation, RoundInput
from tests.bench.searchlib import FIXED_MEGATRON


def round_plan(policy, env, inp, **kw):
    """One round as the sweep makes it: the schedule (rungs, round size, budget) around the searcher."""
    return Schedule(policy.cfg).plan(policy, env, inp, **kw)


@pytest.fixture(scope="module")
def envs():
    src = compose(["+stage=1k", *FIXED_MEGATRON]).cfg
    dst = compose(["+stage=8k", *FIXED_MEGATRON]).cfg
    return (PlanEnv(src.model, src.hardware, src.stage, "twin"), PlanEnv(dst.model, dst.hardware, dst.stage, "twin"))


def _measured(env, n=5, slow=1.25):
    out = []
    for i, c in enumerate(env.plan()[:n]):
        p = env.proposal(c, reason="x")
        out.append(
            Observation(
                key=c.key,
                layout=c.layout,
                raw_components=p.predicted["raw_components"],
                raw_step_s=p.predicted["raw_step_time_s"],
                raw_memory_gb=p.predicted["raw_memory_gb"],
                step_s=c.prediction.step_time_s * slow * (1 + 0.01 * i),
                p99_s=None,
                peak_gb=p.predicted["raw_memory_gb"],
                hbm_gb=80.0,
            )
        )
    return out


@pytest.mark.long
@pytest.mark.parametrize("name", ["calibrated_neighbours", "predicted_topk"])
def test_promotion_maps_measured_top_k_with_edges(envs, name):
    src_env, dst_env = envs
    source = _measured(src_env)
    pol = make_policy(
        PolicyConfig(name=name, schedule=ScheduleConfig(round0_size=6), search=SearcherConfig(promote_top_k=3))
    )
    plan = round_plan(
        pol,
        dst_env,
        RoundInput(round=0, observations=[], known_keys=set(), slots=16, gpu_hours_left=float("inf"), source=source),
        source_stage=src_env.stage,
    )
    promoted = [p for p in plan.proposals if p.edge_kind == "promoted-from"]
    own = [p for p in plan.proposals if not p.reason.startswith("fit-probe")]  # round 0's probes aside
    assert promoted and len(own) <= 6
    # the winner, then the best measured layout of each other region (EP, PP, CP), up to promote_top_k
    best_of_region: dict[tuple, Observation] = {}
    for o in sorted(source, key=lambda o: o.step_s):
        best_of_region.setdefault((o.layout.ep, o.layout.pp, o.layout.cp), o)
    winner = min(source, key=lambda o: o.step_s)
    assert promoted[0].parent_key == winner.key
    assert {p.parent_key for p in promoted} <= {o.key for o in best_of_region.values()}
    for p in promoted:
        parent = next(o for o in source if o.key == p.parent_key)
        assert p.layout.ep >= parent.layout.ep and p.layout.cp >= parent.layout.cp
        assert p.layout.pp == parent.layout.pp and p.layout.mbs == parent.layout.mbs
        g = groups(p.layout, dst_env.stage.gpus, dst_env.stage.global_batch)
        assert g.legal and p.predicted["d_a"] == g.d_a
    assert len({p.key for p in plan.proposals}) == len(plan.proposals)
    if name == "calibrated_neighbours":
        assert plan.fit is not None and plan.fit.n_step == 5  # calibrated on the source stage
        assert any(p.edge_kind is None for p in plan.proposals)  # plus new layouts the model predicts well


def test_the_source_winner_is_promoted_even_when_the_memory_model_prunes_every_mapping(envs):
    """The 1k winner's 8k mappings must not all fall to a memory filter borrowed from 1k rows: its first legal
    mapping goes anyway (its run decides), while the other sources' pruned mappings stay out."""
    from orchestrator.search.calibrate import Fit

    src_env, dst_env = envs
    source = _measured(src_env)
    pol = make_policy(PolicyConfig(name="calibrated_neighbours", search=SearcherConfig(promote_top_k=3)))
    pessimist = Fit(
        method="ratio", memory_factor=100.0, memory_factors={"states": 100.0, "activations": 100.0, "buffers": 100.0}
    )
    inp = RoundInput(round=0, observations=[], known_keys=set(), slots=16, gpu_hours_left=float("inf"), source=source)
    props = pol._promotions(dst_env, inp, src_env.stage, pessimist, 6)
    winner = min(source, key=lambda o: o.step_s)
    assert [p.parent_key for p in props] == [winner.key]
    assert not dst_env.fits(props[0].predicted["memory_gb"])  # the model prunes it; it is promoted all the same
    # the uncalibrated model keeps some mappings: the winner's still leads
    props = pol._promotions(dst_env, inp, src_env.stage, None, 6)
    assert props[0].parent_key == winner.key


def test_promotion_carries_the_best_evidence_of_each_region_screened_results_included(envs):
    """A region (EP, PP, CP) measured only at screen fidelity on the source stage still reaches the next stage."""
    from orchestrator.core.states import Fidelity

    src_env, dst_env = envs
    source = _measured(src_env)
    regions = {(o.layout.ep, o.layout.pp, o.layout.cp) for o in source}
    other = next(
        c
        for c in src_env.plan()
        if c.layout.ep not in {o.layout.ep for o in source} and (c.layout.ep, c.layout.pp, c.layout.cp) not in regions
    )
    p = src_env.proposal(other, reason="x")
    screened = Observation(
        key=other.key,
        layout=other.layout,
        raw_components=p.predicted["raw_components"],
        raw_step_s=p.predicted["raw_step_time_s"],
        raw_memory_gb=p.predicted["raw_memory_gb"],
        step_s=min(o.step_s for o in source) * 1.01,
        peak_gb=p.predicted["raw_memory_gb"],
        hbm_gb=80.0,
        fidelity=Fidelity.SCREEN,
        measure_iters=12,
    )
    pol = make_policy(PolicyConfig(name="calibrated_neighbours", search=SearcherConfig(promote_top_k=3)))
    inp = RoundInput(
        round=0, observations=[], known_keys=set(), slots=16, gpu_hours_left=float("inf"), source=[*source, screened]
    )
    parents = [p.parent_key for p in pol._promotions(dst_env, inp, src_env.stage, None, 12)]
    assert parents[0] == min(source, key=lambda o: o.step_s).key  # the full-window winner first
    assert screened.key in parents
