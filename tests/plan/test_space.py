"""The candidate space: cartesian product, normalisation, raw count."""

from __future__ import annotations

import math

import pytest

from orchestrator.config import compose
from orchestrator.core.schema import SearchConfig
from orchestrator.plan import space
from orchestrator.plan.layout import Layout


def test_product_matches_raw_count_and_is_unique():
    s = SearchConfig(
        tp=[1],
        pp=[4, 8],
        vpp=[1, 2],
        cp=[1, 2],
        ep=[32, 64],
        etp=[1],
        mbs=[1],
        recompute=[[], ["mhc", "mla_up_proj"]],
        offload=[[]],
        dispatcher=["alltoall", "flex:hybridep"],
    )
    layouts = list(space.enumerate_layouts(s))
    assert len(layouts) == space.raw_count(s) == 2 * 2 * 2 * 2 * 2 * 2
    assert len(set(layouts)) == len(layouts)
    assert all(isinstance(x, Layout) for x in layouts)


def test_dispatcher_labels_are_parsed():
    assert space.parse_dispatcher("flex:deepep") == ("flex", "deepep")
    assert space.parse_dispatcher("flex:hybridep") == ("flex", "hybridep")
    assert space.parse_dispatcher("alltoall") == ("alltoall", None)
    assert space.parse_dispatcher("flex") == ("flex", "deepep")  # Megatron's default backend, spelled out
    s = SearchConfig(dispatcher=["flex:ncclep"], pp=[8], vpp=[1], cp=[1], ep=[64], mbs=[1], recompute=[[]])
    (lay,) = list(space.enumerate_layouts(s))
    assert (lay.dispatcher, lay.flex_backend, lay.dispatcher_label) == ("flex", "ncclep", "flex:ncclep")


def test_recompute_sets_are_sorted_and_deduplicated():
    s = SearchConfig(
        pp=[8],
        vpp=[1],
        cp=[1],
        ep=[64],
        mbs=[1],
        dispatcher=["alltoall"],
        recompute=[["mla_up_proj", "mhc"], ["mhc", "mla_up_proj"], []],
        offload=[["expert_fc1"]],
    )
    layouts = list(space.enumerate_layouts(s))
    assert [x.recompute for x in layouts] == [("mhc", "mla_up_proj"), ()]
    assert space.raw_count(s) == 2
    assert layouts[0].offload == ("expert_fc1",)


@pytest.mark.parametrize("name", ["1k", "8k", "16k", "smoke"])
def test_raw_count_is_the_product_of_the_stage_lists(name):
    search = compose([f"+stage={name}"]).cfg.stage.search
    expected = math.prod(n for _, n in space.knob_sizes(search))
    assert space.raw_count(search) == expected
    if name == "16k":
        assert expected >= 20_000  # the planner benchmark's floor


def test_knob_order_covers_every_layout_field():
    assert set(space.FIELD_KNOB) == set(Layout.__dataclass_fields__)
