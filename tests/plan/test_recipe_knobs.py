"""The recipe's knobs in the search (issue 47 item 1): the optimizer precision is numerics the recipe declares
(RecipeConfig.optim), the planner explores only that set, and the memory model charges each layout the bytes of
its own dtypes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.config import compose
from orchestrator.plan import memory, pipeline
from orchestrator.plan.layout import Layout, groups
from orchestrator.plan.planner import plan

GB = memory.GB


def _ranks(cfg, lay: Layout) -> list[memory.StageMemory]:
    stage = cfg.stage
    split = pipeline.split_blocks(cfg.model.num_layers, lay.pp * lay.vpp)
    return memory.stage_memory(cfg.model, cfg.hardware, stage, lay, groups(lay, stage.gpus, stage.global_batch), split)


@pytest.mark.parametrize("optim", ["bf16", "bf16_moments"])
def test_bf16_state_drops_memory_by_the_bytes_of_its_dtypes(optim):
    """Per rank, FP32 grads (4 B/param) and Adam's 12 B of master + moments against the named dtypes: BF16 grads
    halve the grads term; BF16 moments make the state 4 + 2 + 2 = 8 B (2/3 of it); nothing else moves, and the
    drop is 2 B x local params plus 4 B x local params / their optimizer shard."""
    cfg = compose(["+stage=1k"]).cfg
    lay = Layout(pp=8, ep=64, recompute=("mhc", "mla_up_proj"))
    fp32, low = _ranks(cfg, replace(lay, optim="fp32")), _ranks(cfg, replace(lay, optim=optim))
    g = groups(lay, cfg.stage.gpus, cfg.stage.global_batch)
    for a, b in zip(fp32, low, strict=True):
        grad_ratio = 0.5 if optim == "bf16" else 1.0
        assert b.grads == pytest.approx(a.grads * grad_ratio)
        assert b.optimizer == pytest.approx(a.optimizer * 8 / 12)
        assert (b.weights, b.activations, b.dispatch_buffers) == (a.weights, a.activations, a.dispatch_buffers)
        # the same drop from the weights' own parameter counts (2 B each): routed state sharded over D_e,
        # the rest over D_a x CP (the distributed optimizer)
        # (the last rank's MTP block holds routed and dense weights in one term: its drop lies between the two)
        routed, dense = a.routed_weights / 2, (a.weights - a.routed_weights - a.mtp) / 2  # params in GB units
        mtp = a.mtp / 2
        grad_drop = 2 * (routed + dense + mtp) if optim == "bf16" else 0.0
        least = 4 * (routed / g.d_e + (dense + mtp) / (g.d_a * lay.cp)) + grad_drop
        most = 4 * ((routed + mtp) / g.d_e + dense / (g.d_a * lay.cp)) + grad_drop
        assert least - 1e-9 <= a.total - b.total <= most + 1e-9
        if not a.mtp:
            assert a.total - b.total == pytest.approx(least, rel=1e-9)


@pytest.mark.long
def test_the_search_explores_only_the_declared_optimizer_precisions():
    """1k: the V4 recipe's own ["bf16"] gives BF16-state layouts only; ["fp32", "bf16"] adds the FP32 twins, and
    every FP32 layout that fits has a BF16 twin that fits (less memory, same step or faster), while BF16 state fits
    layouts FP32 state cannot. The schema's default is ["fp32"] (Megatron's): it plans FP32 state only."""
    default = compose(["+stage=1k"]).cfg
    assert {c.layout.optim for c in plan(default.model, default.hardware, default.stage).candidates} == {"fp32"}
    base = compose(["+stage=1k", "workload.recipe.optim=[bf16]"]).cfg
    own = plan(base.model, base.hardware, base.stage, recipe=base.workload.recipe)
    assert own.candidates and {c.layout.optim for c in own.candidates} == {"bf16"}
    both_cfg = compose(["+stage=1k", "workload.recipe.optim=[fp32,bf16]"]).cfg
    both = plan(both_cfg.model, both_cfg.hardware, both_cfg.stage, recipe=both_cfg.workload.recipe)
    assert both.raw_count == 2 * own.raw_count
    legal = {c.layout for c in both.candidates}
    fp32 = {lay for lay in legal if lay.optim == "fp32"}
    bf16 = {lay for lay in legal if lay.optim == "bf16"}
    assert bf16 == {c.layout for c in own.candidates}
    assert fp32 and {replace(lay, optim="bf16") for lay in fp32} < bf16
    by = {c.layout: c.prediction for c in both.candidates}
    for lay in fp32:
        twin = by[replace(lay, optim="bf16")]
        assert twin.memory_gb < by[lay].memory_gb and twin.step_time_s <= by[lay].step_time_s
    assert all("mem.exceeds_hbm" in r.rule_ids for r in both.rejected if replace(r.layout, optim="bf16") in bf16)
