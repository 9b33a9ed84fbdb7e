"""Promotion 1k -> 8k through the policy: measured top-K mapped at the same B, edges recorded, new fill."""

from __future__ import annotations

import pytest

from orchestrator.config import compose
from orchestrator.core.schema import PolicyConfig
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


@pytest.mark.parametrize("name", ["calibrated_neighbours", "predicted_topk"])
def test_promotion_maps_measured_top_k_with_edges(envs, name):
    src_env, dst_env = envs
    source = _measured(src_env)
    pol = make_policy(PolicyConfig(name=name, round0_size=6, promote_top_k=3))
    plan = round_plan(
        pol,
        dst_env,
        RoundInput(round=0, observations=[], known_keys=set(), slots=16, gpu_hours_left=float("inf"), source=source),
        source_stage=src_env.stage,
    )
    promoted = [p for p in plan.proposals if p.edge_kind == "promoted-from"]
    assert promoted and len(plan.proposals) <= 6
    top3 = {o.key for o in sorted(source, key=lambda o: o.step_s)[:3]}
    assert {p.parent_key for p in promoted} <= top3
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
