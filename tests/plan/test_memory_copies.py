"""The step model's memory-bound copies outside the kernels (orchestrator/plan/steptime.py): the MoE dispatchers'
permutations (permutation_rows, counted from Megatron-LM dev's token_dispatcher.py) and every block's two residual
adds, both at HBM bandwidth, none where V4's mHC path fuses them."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config import compose
from orchestrator.core.schema import HardwareConfig, StageConfig
from orchestrator.plan import flops, moe, params, pipeline, steptime
from orchestrator.plan.layout import Layout, groups


def model(name: str):
    return compose([f"model={name}"]).cfg.model


def compute_s(m, lay: Layout, hw: HardwareConfig, stage: StageConfig) -> float:
    """The step's compute component (where both copies are charged) of `lay`."""
    g = groups(lay, stage.gpus, stage.global_batch)
    costs, first, last = flops.block_costs(m, stage.seq_length, params.effective_layers(m, stage))
    bps = pipeline.split_blocks(len(costs), lay.pp * lay.vpp, costs, first, last)
    ep_nodes, cp_nodes = moe.min_nodes(lay.ep, stage.gpus_per_node), moe.min_nodes(lay.cp, stage.gpus_per_node)
    return steptime.step_time(m, hw, stage, lay, g, bps, ep_nodes, cp_nodes, routing_sigma=0.0).components["compute"]


@pytest.mark.parametrize("k,ep", [(8, 8), (8, 64), (6, 64), (2, 16)])
def test_the_dispatchers_copy_in_the_order_their_code_fuses_them(k, ep):
    """HybridEP fuses its permutations into the dispatch (nothing on the expert ranks), DeepEP permutes the rows a
    token arrives as (at most one per rank, so no more than k), the alltoall dispatcher permutes before and after
    the all-to-all and sorts by local expert: most rows."""
    rows = {
        name: sum(steptime.permutation_rows(d, b, k, ep, 1, 256))
        for name, (d, b) in {
            "alltoall": ("alltoall", None),
            "deepep": ("flex", "deepep"),
            "hybridep": ("flex", "hybridep"),
        }.items()
    }
    assert rows["hybridep"] < rows["deepep"] < rows["alltoall"]
    assert steptime.permutation_rows("flex", "hybridep", k, ep, 1, 256) == (0.0, 0.0)
    src, exp = steptime.permutation_rows("flex", "deepep", k, ep, 1, 256)
    assert src == 0.0 and 2 * (k + 1) <= exp <= 4 * k  # between one arrival row per token and one per expert


def test_the_alltoall_sort_by_local_expert_needs_more_than_one_local_expert():
    with_sort = steptime.permutation_rows("alltoall", None, 8, 64, 1, 256)
    without = steptime.permutation_rows("alltoall", None, 8, 256, 1, 256)  # one expert per rank
    assert with_sort[0] == without[0] and with_sort[1] > without[1] == 0.0


def test_the_copies_cost_hbm_time_and_the_dispatcher_changes_it():
    """On DeepSeek-V3 (no mHC, a shared expert), one PP rank: the same layout with the alltoall dispatcher
    computes longer than with HybridEP, by the permutation rows' bytes over HBM bandwidth; a part with twice the
    HBM bandwidth halves the difference."""
    m = model("dsv3")
    stage = StageConfig(gpus=64, global_batch=256, seq_length=4096)
    hw = compose(["hardware=gb200"]).cfg.hardware
    base = Layout(tp=1, pp=1, vpp=1, ep=32, mbs=1, dispatcher="flex", flex_backend="hybridep")
    a2a = dataclasses.replace(base, dispatcher="alltoall", flex_backend=None)
    diff = compute_s(m, a2a, hw, stage) - compute_s(m, base, hw, stage)
    fast = dataclasses.replace(hw, hbm_gb_s=hw.hbm_gb_s * 2)
    diff_fast = compute_s(m, a2a, fast, stage) - compute_s(m, base, fast, stage)
    assert diff > 0 and diff_fast == pytest.approx(diff / 2, rel=1e-6)


def test_residual_adds_are_charged_on_the_gpt_path_and_fused_on_v4s():
    """A plain residual stream pays its two adds per block; V4's mHC folds them into h_post_bda (none)."""
    assert steptime._residual_rows(model("dsv3"), ()) == steptime.RESIDUAL_ADDS_PER_BLOCK * steptime.RESIDUAL_ADD_ROWS
    assert steptime._residual_rows(model("dsv3"), ("full",)) > steptime._residual_rows(model("dsv3"), ())
    assert steptime._residual_rows(model("dsv4_flash"), ()) == 0.0
    assert steptime._residual_rows(model("dsv4_pro"), ("full",)) == 0.0
