"""The recipe's knobs in the search (issue 47 item 1): the optimizer precision is numerics the recipe declares
(RecipeConfig.optim), the planner explores only that set, and the memory model charges each layout the bytes of
its own dtypes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.config import compose
from orchestrator.core.knobs import parse_dispatcher
from orchestrator.plan import memory, pipeline
from orchestrator.plan.layout import Layout, groups
from orchestrator.plan.planner import plan

GB = memory.GB
# the 1k stage without its offload list: an offload layout stays only where its no-offload sibling does not fit
# (plan.offload_not_needed), which differs between FP32 and BF16 state, so the twin sets below compare without it
NO_OFFLOAD = ("stage.search.offload=[[]]",)


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
    default = compose(["+stage=1k", *NO_OFFLOAD]).cfg
    assert {c.layout.optim for c in plan(default.model, default.hardware, default.stage).candidates} == {"fp32"}
    base = compose(["+stage=1k", "workload.recipe.optim=[bf16]", *NO_OFFLOAD]).cfg
    own = plan(base.model, base.hardware, base.stage, recipe=base.workload.recipe)
    assert own.candidates and {c.layout.optim for c in own.candidates} == {"bf16"}
    both_cfg = compose(["+stage=1k", "workload.recipe.optim=[fp32,bf16]", *NO_OFFLOAD]).cfg
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


def test_mxfp8_on_a_hopper_part_is_rejected_with_its_rule():
    """The hardware group says which precisions the part has: MXFP8 needs Blackwell (peak_mxfp8_tflops), so on H100
    every MXFP8 layout is rejected by mcore.precision_on_hardware (a rule citing dev), while FP8 blockwise is legal
    there and MXFP8 is legal on GB300."""
    from orchestrator.plan import rules as R
    from orchestrator.plan.planner import Planned, evaluate

    cfg = compose(["+stage=1k", "hardware=h100", "workload.recipe.precision=[bf16,fp8,mxfp8]"]).cfg
    res = plan(cfg.model, cfg.hardware, cfg.stage, recipe=cfg.workload.recipe)
    mx = [r for r in res.rejected if r.layout.precision == "mxfp8"]
    assert mx and all("mcore.precision_on_hardware" in r.rule_ids for r in mx)
    assert all(c.layout.precision != "mxfp8" for c in res.candidates)
    assert not any("mcore.precision_on_hardware" in r.rule_ids for r in res.rejected if r.layout.precision == "fp8")
    assert next(r for r in R.RULES if r.id == "mcore.precision_on_hardware").source.startswith("dev ")
    lay = Layout(pp=8, ep=64, recompute=("mhc", "mla_up_proj"))
    h100 = evaluate(cfg.model, cfg.hardware, cfg.stage, replace(lay, precision="mxfp8"), check_memory=False)
    assert not isinstance(h100, Planned) and "mcore.precision_on_hardware" in h100.rule_ids
    gb = compose(["+stage=1k", "hardware=gb300"]).cfg
    assert isinstance(
        evaluate(gb.model, gb.hardware, gb.stage, replace(lay, precision="mxfp8"), check_memory=False), Planned
    )


@pytest.mark.long
def test_the_1k_plan_json_lists_the_recipe_knobs_where_legal():
    """`plan +stage=1k --format json --show-rejected` with the recipe's numerics declared wide (FP32 or BF16 state;
    BF16, FP8 blockwise or MXFP8 compute) on the default H200: legal layouts with BF16 optimizer state, with activation
    offload and with FP8 compute; MXFP8 only rejected, by its rule; every rejected layout names at least one rule;
    and no offload layout is kept whose no-offload sibling is kept too."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "plan",
            "+stage=1k",
            "workload.recipe.optim=[fp32,bf16]",
            "workload.recipe.precision=[bf16,fp8,mxfp8]",
            "--format",
            "json",
            "--show-rejected",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    d = json.loads(out)
    legal = d["candidates"]
    assert any(c["optim"] == "bf16" for c in legal)
    assert any(c["offload"] for c in legal)
    assert any(c["precision"] == "fp8" for c in legal)
    assert not any(c["precision"] == "mxfp8" for c in legal)
    assert all(r["rules"] for r in d["rejected"]) and len(d["rejected"]) + len(legal) == d["raw_count"]
    mx = [r for r in d["rejected"] if r["layout"]["precision"] == "mxfp8"]
    assert mx and all("mcore.precision_on_hardware" in r["rules"] for r in mx)

    def row_layout(c: dict) -> Layout:  # a candidate row prints its dispatcher as "flex:hybridep"
        name, backend = parse_dispatcher(c["dispatcher"])
        return Layout.from_dict({**c, "dispatcher": name, "flex_backend": backend})

    no_offload = {row_layout(c) for c in legal if not c["offload"]}
    assert not [c for c in legal if c["offload"] and row_layout(c).but(offload=[]) in no_offload]
    dominated = [r for r in d["rejected"] if r["rules"] == ["plan.offload_not_needed"]]
    assert dominated and all(Layout.from_dict(r["layout"]).but(offload=[]) in no_offload for r in dominated)


def test_best_names_the_winners_compute_and_optimizer_numerics():
    """`best` says which training semantics the winner runs: the compute precision (with the --fp8-recipe it
    writes) beside the optimizer's, as the recipe declared them (issue 47 item 1)."""
    from orchestrator.commands.best import summary_rows

    hit = {
        "metrics": {},
        "attempt": {"job_id": "1", "state": "COMPLETED", "attempt_no": 1, "job_dir": "/x"},
        "simulated": True,
        "round": 0,
        "chosen_on": "full",
        "key": "k",
    }
    rows = dict(summary_rows(hit, Layout(pp=8, ep=64, precision="fp8", optim="bf16")))
    assert rows["compute numerics"] == "fp8 (--fp8-recipe blockwise)"
    assert rows["optimizer numerics"].startswith("main grads bf16")
    assert dict(summary_rows(hit, Layout()))["compute numerics"] == "bf16 (no FP8 recipe: BF16 GEMMs)"
