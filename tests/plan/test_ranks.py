"""orchestrator.plan.ranks against megatron-core's own RankGenerator, and node_spans against brute force."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.plan.layout import Layout
from orchestrator.plan.ranks import (
    DEFAULT_ORDER,
    DENSE_GROUPS,
    EXPERT_GROUPS,
    TP_PP_DP_ORDER,
    coords,
    node_spans,
    nodes_of,
    rank_groups,
)
from tests.megatron_env import import_megatron

SIZES = st.sampled_from([1, 2, 3, 4, 8])


@st.composite
def layouts_and_worlds(draw, max_world: int = 256):
    tp, cp, pp, ep, etp = (draw(SIZES) for _ in range(5))
    per_stage = math.lcm(tp * cp, etp * ep) * draw(st.integers(1, 4))
    world = per_stage * pp
    if world > max_world:
        # Shrink toward something legal rather than discarding the example.
        pp, per_stage = 1, math.lcm(tp * cp, etp * ep)
        world = per_stage
    if world > max_world:
        tp, cp, ep, etp = 1, cp, ep, 1
        world = math.lcm(cp, ep)
    mapping = draw(st.booleans())
    return Layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, use_tp_pp_dp_mapping=mapping), world


@pytest.fixture(scope="module")
def rank_generator():
    import_megatron()
    from megatron.core.parallel_state import RankGenerator

    return RankGenerator


def _megatron_groups(RankGenerator, layout: Layout, world: int, order: str) -> dict:
    """What initialize_model_parallel asks its two RankGenerators for (gtp_remat = 1)."""
    dense = RankGenerator(
        tp=layout.tp, ep=1, dp=world // (layout.tp * layout.cp * layout.pp), pp=layout.pp, cp=layout.cp, order=order
    )
    expert = RankGenerator(
        tp=layout.etp, ep=layout.ep, dp=world // (layout.etp * layout.ep * layout.pp), pp=layout.pp, cp=1, order=order
    )
    out = {name: dense.get_ranks(tok) for name, tok in DENSE_GROUPS.items()}
    out.update({name: expert.get_ranks(tok) for name, tok in EXPERT_GROUPS.items()})
    return out


@pytest.mark.long
@settings(max_examples=150, deadline=None)
@given(layouts_and_worlds())
def test_rank_groups_match_megatron_rank_generator(rank_generator, case):
    layout, world = case
    same_dp = world // (layout.tp * layout.cp) == world // (layout.etp * layout.ep)
    for order in (DEFAULT_ORDER, TP_PP_DP_ORDER):
        if order == TP_PP_DP_ORDER and layout.pp > 1 and not same_dp:
            with pytest.raises(ValueError, match="expert DP"):  # initialize_model_parallel asserts
                rank_groups(layout, world, order)
            continue
        ours = rank_groups(layout, world, order)
        assert ours == _megatron_groups(rank_generator, layout, world, order)
        assert ours["pp"] == ours["epp"]  # Megatron asserts the two grids agree on PP groups
    # Default order follows the layout's --use-tp-pp-dp-mapping knob.
    expected_order = TP_PP_DP_ORDER if layout.use_tp_pp_dp_mapping else DEFAULT_ORDER
    if expected_order == DEFAULT_ORDER or layout.pp == 1 or same_dp:
        assert rank_groups(layout, world) == rank_groups(layout, world, expected_order)


@pytest.mark.long
@settings(max_examples=80, deadline=None)
@given(layouts_and_worlds())
def test_coords_invert_megatrons_dense_groups(rank_generator, case):
    """A rank's coordinates along one axis are its index in Megatron's group for that axis, and the other
    coordinates are shared by the whole group (so the job side's rank -> PP stage is Megatron's)."""
    layout, world = case
    order = TP_PP_DP_ORDER if layout.use_tp_pp_dp_mapping else DEFAULT_ORDER
    if (
        order == TP_PP_DP_ORDER
        and layout.pp > 1
        and world // (layout.tp * layout.cp) != world // (layout.etp * layout.ep)
    ):
        with pytest.raises(ValueError, match="expert DP"):
            coords(layout, world, 0)
        return
    megatron = _megatron_groups(rank_generator, layout, world, order)
    for axis in ("tp", "cp", "dp", "pp"):
        for group in megatron[axis]:
            at = [coords(layout, world, r) for r in group]
            assert [c[axis] for c in at] == list(range(len(group))), axis
            assert all(
                {k: v for k, v in c.items() if k != axis} == {k: v for k, v in at[0].items() if k != axis} for c in at
            )
    with pytest.raises(ValueError, match="outside"):
        coords(layout, world, world)


@pytest.mark.long
def test_guide_config_a_groups(rank_generator):
    """Config A (1024 GPUs, TP1 PP8 CP1 EP64 ETP1): D_a = 128, D_e = 2, 16 EP groups per stage."""
    layout = Layout(tp=1, pp=8, cp=1, ep=64, etp=1)
    g = rank_groups(layout, 1024)
    assert g == _megatron_groups(rank_generator, layout, 1024, DEFAULT_ORDER)
    assert len(g["dp"][0]) == 128 and len(g["edp"][0]) == 2 and len(g["ep"][0]) == 64
    assert len(g["pp"]) == 128 and g["pp"][0] == list(range(0, 1024, 128))
    assert g["pp"] == g["epp"]  # Megatron asserts the two grids agree on PP groups
    assert g["ep"][0] == list(range(64))  # consecutive ranks: 8 whole nodes


def test_every_rank_in_exactly_one_group_of_each_kind():
    layout = Layout(tp=2, cp=2, pp=2, ep=4, etp=2)
    for name, groups in rank_groups(layout, 64).items():
        flat = sorted(itertools.chain.from_iterable(groups))
        assert flat == list(range(64)), name


def test_illegal_world_raises():
    with pytest.raises(ValueError, match="not divisible"):
        rank_groups(Layout(tp=3, ep=4), 16)
    with pytest.raises(ValueError):
        node_spans(Layout(ep=5), 64, 8)


@pytest.mark.long
@settings(max_examples=400, deadline=None)
@given(layouts_and_worlds(max_world=512), st.sampled_from([1, 2, 4, 6, 8, 16]))
def test_node_spans_match_brute_force(case, gpus_per_node):
    layout, world = case
    spans = node_spans(layout, world, gpus_per_node)
    for order in (DEFAULT_ORDER, TP_PP_DP_ORDER):  # TP/CP/EP strides are the same in both orders
        try:
            g = rank_groups(layout, world, order)
        except ValueError:
            continue  # Megatron refuses this order for this layout
        brute_ep = max(nodes_of(grp, gpus_per_node) for grp in g["ep"])
        brute_cp = max(nodes_of(grp, gpus_per_node) for grp in g["cp"])
        assert spans == (brute_ep, brute_cp), order


def test_guide_fact_ep64_spans_at_least_8_nodes():
    """Guide: with 8 GPUs per node, EP64 spans at least 8 nodes."""
    for n in (1024, 8192, 16384):
        for tp, cp in ((1, 1), (1, 4), (2, 2)):
            ep_nodes, _ = node_spans(Layout(tp=tp, cp=cp, pp=8, ep=64, etp=1), n, 8)
            assert ep_nodes >= 8
    assert node_spans(Layout(pp=8, ep=64), 1024, 8) == (8, 1)
    assert node_spans(Layout(pp=8, ep=64, etp=2), 1024, 8) == (16, 1)  # ETP2 strides EP over 2x the ranks
    assert node_spans(Layout(tp=4, cp=4, pp=8, ep=8), 8192, 8) == (1, 2)  # CP stride TP=4: 16 ranks, 2 nodes


def test_node_spans_answers_a_whole_plans_layouts():
    """>= 20k candidates per plan (the 16k stage's search space): node_spans answers each one. Its speed is part
    of the planner's, measured by `make bench` (tests/bench/bench_plan.py), never asserted in a test."""
    candidates = []
    for tp, pp, vpp, cp, ep, etp, mbs, rc, off, disp in itertools.product(
        [1, 2],
        [4, 8, 16],
        [1, 2, 4],
        [1, 2, 4, 8],
        [32, 64, 128, 192, 384],
        [1, 2],
        [1, 2],
        [(), ("mla_up_proj", "mhc"), ("moe_act",), ("full",), ("core_attn",)],
        [(), ("expert_fc1",), ("qkv_linear",)],
        ["alltoall", "flex"],
    ):
        if (16384 // pp) % (etp * ep) == 0:
            candidates.append(
                Layout(
                    tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs, recompute=rc, offload=off, dispatcher=disp
                )
            )
    assert len(candidates) >= 20000
    spans = [node_spans(c, 16384, 8) for c in candidates]
    assert all(ep >= 1 and cp >= 1 for ep, cp in spans)
