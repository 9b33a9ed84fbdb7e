"""The pieces of orchestrator/plan that several models share: the recompute/offload coverage table, the
per-rank segment sums and the hot-rank skew. Each had two or three copies; these tests pin the one left."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig
from orchestrator.plan import flops, memory, moe, params, pipeline, recompute, rules, steptime
from orchestrator.plan.layout import Layout, groups
from tests.megatron_env import import_megatron

MODEL = ModelConfig()
HW = HardwareConfig()
STAGE = StageConfig()


def _allowed_sets() -> list[set[str]]:
    """The `allowed_modules = {...}` sets of megatron-core's TransformerConfig.__post_init__, in source order:
    selective recompute first, fine-grained offload second (transformer_config.py, 0.19.2)."""
    import_megatron()
    from megatron.core.transformer import transformer_config

    tree = ast.parse(inspect.getsource(transformer_config))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "allowed_modules" for t in node.targets):
            out.append((node.lineno, {e.value for e in node.value.elts}))
    return [s for _, s in sorted(out)]


def test_module_tables_are_megatrons():
    """Our recompute table is Megatron's selective set plus the dev branch's mhc/gdn (and "full"); the offload
    table is Megatron's set exactly. The rules read the same table."""
    recompute_allowed, offload_allowed = _allowed_sets()[:2]
    assert set(recompute.RECOMPUTE) - recompute_allowed == {"mhc", "gdn"}  # dev-only (dev TC:2197)
    assert recompute_allowed <= set(recompute.RECOMPUTE)
    assert set(recompute.OFFLOAD) == offload_allowed
    known = rules.BY_ID["mcore.recompute_known"]  # the rule that rejects an unknown module reads the table
    assert known.violated(_ctx(Layout(recompute=("gdn_bogus",)))) and not known.violated(
        _ctx(Layout(recompute=("mhc",)))
    )


def _ctx(lay: Layout) -> rules.Ctx:
    return rules.Ctx(MODEL, STAGE, HW, lay, MODEL.num_layers)


def test_coverage_names_real_tensors_and_flop_pieces():
    moe_block = memory.block_activation_elems(MODEL, 4, True)
    dense_block = memory.block_activation_elems(MODEL, 4, False)
    pieces = {f.name for f in dataclasses.fields(flops.BlockFlops)}
    assert set(recompute.PIECES) <= pieces and len(set(recompute.PIECES)) == len(recompute.PIECES)
    for name, cov in {**recompute.RECOMPUTE, **recompute.OFFLOAD}.items():
        assert cov.drops <= set(moe_block) | set(dense_block), name
        assert cov.repeats <= set(recompute.PIECES), name
    for name, cov in recompute.RECOMPUTE.items():
        if not name.startswith("gdn"):  # a V4 block has no GatedDeltaNet
            assert cov.drops and cov.repeats, name  # frees something and pays for it in FLOPs


def test_moe_recompute_repeats_the_whole_moe_layer():
    """Megatron's "moe" checkpoints the whole MoE layer (moe_layer.py:250-254), its expert activation
    included: it repeats at least what moe_act and shared_experts repeat, and adding them costs nothing."""
    b = flops.block_flops(MODEL, 4, True, STAGE.seq_length)
    moe_only = flops.recompute_block(b, ["moe"])
    assert moe_only == pytest.approx(b.router + b.expert + b.shared + b.act)
    assert moe_only > flops.recompute_block(b, ["moe_act"]) + flops.recompute_block(b, ["shared_experts"])
    assert flops.recompute_block(b, ["moe", "moe_act", "shared_experts"]) == moe_only
    assert flops.recompute_block(b, ["full"]) == b.total
    assert recompute.redispatches(["moe"]) and recompute.redispatches(["full"])
    assert not recompute.redispatches(["moe_act", "shared_experts", "mhc"])


def test_recompute_drops_only_its_tensors_from_memory():
    t = memory.block_activation_elems(MODEL, 4, True)
    for name, cov in recompute.RECOMPUTE.items():
        kept_d, kept_e, _ = memory._kept(t, (name,), ())
        kept = sum(v for k, v in t.items() if k not in cov.drops | memory.NOT_SAVED)  # nothing saves the fc2 output
        assert kept_d + kept_e == pytest.approx(kept), name


@settings(max_examples=80, deadline=None)
@given(
    pp=st.sampled_from([1, 2, 3, 4, 8]),
    vpp=st.sampled_from([1, 2, 3]),
    data=st.data(),
)
def test_rank_sums_are_the_sums_over_each_ranks_segments(pp, vpp, data):
    n_seg = pp * vpp
    bps = data.draw(st.lists(st.integers(1, 5), min_size=n_seg, max_size=n_seg))
    values = data.draw(st.lists(st.floats(0, 1e6), min_size=sum(bps), max_size=sum(bps)))
    counts = [1] * sum(bps)
    sums = pipeline.rank_sums((pipeline.cumulative(values), pipeline.cumulative(counts)), bps, pp, vpp)
    starts = pipeline.cumulative(bps)
    for r in range(pp):
        segs = [s for s in range(n_seg) if s % pp == r]  # segment i runs on PP rank i % PP
        expected = sum(sum(values[starts[s] : starts[s + 1]]) for s in segs)
        # differences of prefix sums: exact up to rounding of the running total
        assert sums[r][0] == pytest.approx(expected, rel=1e-9, abs=1e-12 * sum(values))
        assert sums[r][1] == sum(bps[s] for s in segs) and isinstance(sums[r][1], int)


def test_memory_and_step_time_split_blocks_alike():
    """Both models sum the same blocks per PP rank (their shared rank_sums): the MoE layers each counts."""
    lay = Layout(pp=4, vpp=2, ep=64, cp=1)
    g = groups(lay, STAGE.gpus, STAGE.global_batch)
    costs, first, last = flops.block_costs(MODEL, STAGE.seq_length)
    bps = pipeline.split_blocks(len(costs), 8, costs, first, last)
    mem = memory.stage_memory(MODEL, HW, STAGE, lay, g, bps)
    px = steptime._time_prefix(params.model_key(MODEL), MODEL.num_layers, STAGE.seq_length, ())
    moe_layers = [row[6] for row in steptime._rank_sums(px, tuple(bps), lay.pp, lay.vpp)]
    mtp = [px.last_moe if r == lay.pp - 1 else 0 for r in range(lay.pp)]
    assert [s.moe_blocks for s in mem] == [int(x - y) for x, y in zip(moe_layers, mtp)]
    assert sum(s.blocks for s in mem) == MODEL.num_layers


@pytest.mark.parametrize("ep", [8, 32, 64, 384])
def test_one_hot_rank_skew_capped_by_the_capacity_factor(ep):
    sigma = memory.DEFAULT_ROUTING_SIGMA
    assert moe.rank_skew(sigma, 384, ep) == moe.hot_rank_factor(sigma, 384 // ep, ep)
    assert moe.rank_skew(sigma, 384, ep, capacity_factor=1.0) == 1.0
    assert moe.rank_skew(sigma, 384, ep, capacity_factor=4.0) == moe.rank_skew(sigma, 384, ep)


def _a2a(dispatcher: str, sigma: float, backend: str | None = None) -> float:
    lay = Layout(pp=8, ep=64, dispatcher=dispatcher, flex_backend=backend)
    g = groups(lay, STAGE.gpus, STAGE.global_batch)
    costs, first, last = flops.block_costs(MODEL, STAGE.seq_length)
    bps = pipeline.split_blocks(len(costs), 8, costs, first, last)
    t = steptime.step_time(MODEL, HW, STAGE, lay, g, bps, 8, 1, routing_sigma=sigma)
    return t.components["a2a"]


def test_allgather_traffic_ignores_routing_skew_all_to_all_does_not():
    """The allgather dispatcher sends every token of the group to every rank whatever the routing
    (token_dispatcher.py:314-316, 380-382); all-to-all and flex send the hot rank more. The step-time
    model used to skew allgather traffic too, unlike the memory model's allgather buffers."""
    assert _a2a("allgather", 0.8) == _a2a("allgather", 0.0)
    assert _a2a("alltoall", 0.8) > _a2a("alltoall", 0.0)
    assert _a2a("flex", 0.8, "deepep") > _a2a("flex", 0.0, "deepep")
