"""Every legality rule fires on a violating candidate and stays quiet on a legal one."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig
from orchestrator.plan import rules as R
from orchestrator.plan.layout import Layout
from orchestrator.plan.params import d_window

MODEL = ModelConfig()  # DeepSeek-V4-Pro defaults (61 blocks, E=384, dsv4_hybrid)
STAGE = StageConfig()  # 1k: N=1024, B=4096, S=8192
HW = HardwareConfig()  # h100
A = Layout(tp=1, pp=8, vpp=1, cp=1, ep=64, etp=1, mbs=1)  # the guide's config A


def ctx(layout=A, stage=None, model=None, hw=None, **kw):
    stage = replace(STAGE, **(stage or {}))
    model = replace(MODEL, **(model or {}))
    hw = replace(HW, **(hw or {}))
    return R.Ctx(model, stage, hw, layout, kw.pop("blocks", model.num_layers), **kw)


def lay(**kw):
    return replace(A, **kw)


B8K = {"gpus": 8192}
QWEN_GQA = {"attention_variant": "gqa", "num_attention_heads": 64, "num_query_groups": 4, "hyper_connection_streams": 1}
# rule id -> (a context that violates it, a context that does not)
CASES = {
    "v4.tp1_with_te": (ctx(lay(tp=2)), ctx()),
    "v4.cp_needs_packed_thd": (ctx(lay(cp=4), stage={"packed_sequences": False}), ctx(lay(cp=4))),
    "v4.packed_needs_cudnn": (ctx(stage={"attention_backend": "flash"}), ctx()),
    "mcore.attention_backend_known": (
        ctx(stage={"attention_backend": "cudnn9"}),
        ctx(stage={"attention_backend": "flash", "packed_sequences": False}),
    ),
    "v4.cp_contiguous": (
        ctx(lay(cp=2), stage={"cp_partition_mode": "striped"}),
        ctx(lay(cp=1), stage={"cp_partition_mode": "striped"}),
    ),
    "v4.no_deterministic_packed": (ctx(stage={"deterministic_mode": True}), ctx()),
    "v4.static_cp_only": (ctx(argv=("--dynamic-context-parallel",)), ctx(argv=("--context-parallel-size", "4"))),
    "v4.no_core_attn_recompute": (ctx(lay(recompute=("core_attn",))), ctx(lay(recompute=("mla_up_proj",)))),
    "v4.no_qkv_linear_offload": (ctx(lay(offload=("qkv_linear",))), ctx(lay(offload=("expert_fc1",)))),
    # S=8192: CP64 leaves 128 rows... S/CP=64 < D_window=128 fires; CP4 (the guide's C) has 2048 rows.
    "v4.cp_d_window": (ctx(lay(cp=128), stage=B8K), ctx(lay(cp=4), stage=B8K)),
    "v4.pattern_segments": (ctx(split=(30, 31), pattern="x|y"), ctx(split=(8,) * 5 + (7,) * 3)),
    "v4.pattern_excludes_layout_flags": (
        ctx(argv=("--pipeline-model-parallel-layout", "Et|tL")),
        ctx(argv=("--hybrid-layer-pattern", "HE|CE")),
    ),
    "v4.no_moe_enable_deepep": (ctx(argv=("--moe-enable-deepep",)), ctx(argv=("--moe-token-dispatcher-type", "flex"))),
    "v4.mnnvl_needs_hybridep": (
        ctx(lay(dispatcher="flex", flex_backend="deepep"), hw={"gpus_per_nvlink_domain": 72}),
        ctx(lay(dispatcher="flex", flex_backend="hybridep"), hw={"gpus_per_nvlink_domain": 72}),
    ),
    "mcore.dense_grid": (ctx(lay(pp=3)), ctx(lay(pp=8))),
    "mcore.expert_grid": (ctx(lay(ep=384, pp=8)), ctx(lay(ep=128, pp=8))),
    "mcore.experts_div_ep": (ctx(lay(ep=256)), ctx(lay(ep=192))),
    "mcore.heads_div_tp": (ctx(lay(tp=3)), ctx(lay(tp=2))),
    "mcore.query_groups_div_tp": (  # Qwen3-235B: 4 KV groups; TP 8 replicates them, TP 3 splits none evenly
        ctx(lay(tp=3), model=QWEN_GQA),
        ctx(lay(tp=8), model=QWEN_GQA),
    ),
    "mcore.ep_a2a_overlap": (  # PP8 without VPP under EP overlap; with VPP2 it is legal
        ctx(argv=("--overlap-moe-expert-parallel-comm",)),
        ctx(lay(vpp=2), argv=("--overlap-moe-expert-parallel-comm",)),
    ),
    "mcore.precision_on_hardware": (ctx(lay(precision="mxfp8")), ctx(lay(precision="fp8_cs"))),
    "mcore.gbs_div_mbs_dp": (ctx(lay(mbs=3)), ctx(lay(mbs=2))),
    "mcore.seq_div_2cp": (ctx(stage={"seq_length": 8190}, layout=lay(cp=2)), ctx(lay(cp=2))),
    "mcore.tp_pp_dp_mapping": (ctx(lay(use_tp_pp_dp_mapping=True)), ctx(lay(use_tp_pp_dp_mapping=True, ep=1))),
    "mcore.vpp_needs_pp": (ctx(lay(pp=1, vpp=2)), ctx(lay(pp=2, vpp=2))),
    # config B (8k, CP1: m=4 < PP=8) with VPP2 is rejected; config C (CP4: m=16) is legal.
    "mcore.vpp_group_bounds": (ctx(lay(vpp=2), stage=B8K), ctx(lay(vpp=2, cp=4), stage=B8K)),
    # 1k with mbs=2 and pp=8: m=16, fine; B=4096+... use B=1280 -> D_a=128, m=10: 10 % 8 = 2 < 8
    "mcore.vpp_group_remainder": (
        ctx(lay(vpp=2), stage={"global_batch": 1280}),
        ctx(lay(vpp=2), stage={"global_batch": 2048}),
    ),
    "mcore.min_blocks_per_segment": (ctx(lay(pp=16, vpp=4)), ctx(lay(pp=16, vpp=2))),
    "mcore.hash_layers_first_segment": (
        ctx(lay(pp=16, vpp=2), split=(2,) * 29 + (1, 1, 1)),
        ctx(lay(pp=16, vpp=2), split=(3,) * 13 + (1,) * 19),
    ),
    "mcore.dispatcher_known": (
        ctx(lay(dispatcher="flex", flex_backend="mooncake")),
        ctx(lay(dispatcher="flex", flex_backend="ncclep")),
    ),
    "mcore.hash_layers_are_layer_numbers": (  # 3 hash MoE blocks: the 3rd 'E' is layer 6, not 3
        ctx(argv=("--hybrid-layer-pattern", "HEHE|CECE/WE", "--moe-n-hash-layers", "3")),
        ctx(argv=("--hybrid-layer-pattern", "HEHE|CECE/WE", "--moe-n-hash-layers", "6")),
    ),
    "mcore.flex_needs_tp_ep": (
        ctx(lay(ep=1, dispatcher="flex", flex_backend="deepep")),
        ctx(lay(ep=1, dispatcher="flex", flex_backend="hybridep")),
    ),
    "mcore.ncclep_no_capacity": (
        ctx(lay(dispatcher="flex", flex_backend="ncclep", capacity_factor=1.0)),
        ctx(lay(dispatcher="flex", flex_backend="deepep", capacity_factor=1.0)),
    ),
    "mcore.capacity_needs_aux_loss": (
        ctx(lay(capacity_factor=1.0), argv=("--moe-router-load-balancing-type", "sinkhorn")),
        ctx(lay(capacity_factor=1.0), argv=("--moe-router-load-balancing-type", "seq_aux_loss")),
    ),
    "mcore.padding_needs_capacity": (
        ctx(argv=("--moe-pad-expert-input-to-capacity",)),
        ctx(
            lay(capacity_factor=1.0), argv=("--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor", "1.0")
        ),
    ),
    "mcore.deepep_no_padding": (
        ctx(lay(dispatcher="flex", flex_backend="deepep"), argv=("--moe-pad-expert-input-to-capacity",)),
        ctx(lay(dispatcher="flex", flex_backend="hybridep"), argv=("--moe-pad-expert-input-to-capacity",)),
    ),
    "mcore.recompute_known": (ctx(lay(recompute=("attention",))), ctx(lay(recompute=("moe_act", "mhc")))),
    "mcore.full_vs_selective": (ctx(lay(recompute=("full", "moe_act"))), ctx(lay(recompute=("full",)))),
    "mcore.moe_act_needs_grouped_gemm": (
        ctx(lay(recompute=("moe_act",)), moe_grouped_gemm=False),
        ctx(lay(recompute=("moe_act",))),
    ),
    "mcore.offload_known": (ctx(lay(offload=("router",))), ctx(lay(offload=("moe_act",)))),
    "mcore.offload_vs_moe_recompute": (
        ctx(lay(recompute=("moe",), offload=("expert_fc1",))),
        ctx(lay(recompute=("moe_act",), offload=("expert_fc1",))),
    ),
    "mcore.attn_proj_offload_needs_core_attn": (
        ctx(lay(offload=("attn_proj",))),
        ctx(lay(offload=("attn_proj", "core_attn"))),
    ),
    "mcore.mhc_recompute_needs_mhc": (
        ctx(lay(recompute=("mhc",)), model={"hyper_connection_streams": 1}),
        ctx(lay(recompute=("mhc",))),
    ),
    "mcore.mhc_recompute_vs_norm_offload": (
        ctx(lay(recompute=("mhc",), offload=("attn_norm",))),
        ctx(lay(recompute=("mhc",), offload=("attn_proj", "core_attn"))),
    ),
    "mcore.offload_without_cpu_offloading": (
        ctx(lay(offload=("expert_fc1",)), argv=("--cpu-offloading-num-layers", "2")),
        ctx(lay(offload=("expert_fc1",)), argv=("--offload-modules", "x")),
    ),
    "mem.exceeds_hbm": (ctx(memory_gb=77.0), ctx(memory_gb=75.0)),  # h100: 80 GB, margin 4 GB
    "mcore.optim_known": (ctx(lay(optim="fp8")), ctx(lay(optim="bf16_moments"))),
    "mcore.precision_aware_needs_adam_distopt": (
        ctx(lay(optim="bf16"), stage={"use_distributed_optimizer": False}),
        ctx(lay(optim="fp32"), stage={"use_distributed_optimizer": False}),
    ),
    "mcore.bf16_grads_vs_fp32_accumulation": (
        ctx(lay(optim="bf16"), argv=("--accumulate-allreduce-grads-in-fp32",)),
        ctx(lay(optim="bf16_moments"), argv=("--accumulate-allreduce-grads-in-fp32",)),
    ),
    # V4-Pro: 3 hash-routed MoE layers inside mHC wrappers (4 streams): full recompute drops their input_ids
    "v4.full_recompute_hash_mhc": (
        ctx(lay(recompute=("full",))),
        ctx(lay(recompute=("full",)), model={"hyper_connection_streams": 1}),
    ),
}


def test_every_rule_has_a_case():
    assert set(CASES) == {r.id for r in R.RULES}  # plan.offload_not_needed: the planner's cut (test_recipe_knobs)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires_and_stays_quiet(rule_id):
    rule = R.BY_ID[rule_id]
    bad, good = CASES[rule_id]
    assert rule.violated(bad), f"{rule_id} should fire"
    assert not rule.violated(good), f"{rule_id} should not fire"
    assert rule in R.violations(bad)


def test_rules_are_data_with_reasons_and_sources():
    for r in R.RULES:
        assert r.id.split(".")[0] in {"v4", "mcore", "mem"}
        assert r.reason and "\n" not in r.reason and r.source
        assert r.phase in R.PHASES
        assert set(r.needs) <= set(Layout.__dataclass_fields__)


def test_guide_configs_are_legal_before_memory():
    """A (1k), B and C (8k) with VPP=1 break no layout rule; B with VPP2 breaks the VPP rule only."""
    c8 = {"gpus": 8192}
    assert R.violations(ctx()) == []
    assert R.violations(ctx(stage=c8)) == []
    assert R.violations(ctx(lay(cp=4), stage=c8)) == []
    assert [r.id for r in R.violations(ctx(lay(vpp=2), stage=c8))] == ["mcore.vpp_group_bounds"]


def test_d_window_is_the_largest_requirement():
    assert d_window(MODEL) == 128  # csa_window_size 128, ratio 128 layers
    assert d_window(replace(MODEL, csa_window_size=4, csa_compress_ratios=[4, 0])) == 8


def test_later_phases_are_quiet_without_their_input():
    for r in R.RULES:
        if r.phase in ("argv", "memory"):
            assert not r.violated(ctx(lay(offload=("expert_fc1",))))


# needs must be honest: the verdict depends only on the fields a rule declares
_layouts = st.builds(
    Layout,
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4, 8, 16]),
    vpp=st.sampled_from([1, 2, 4]),
    cp=st.sampled_from([1, 2, 4, 8]),
    ep=st.sampled_from([1, 8, 32, 64, 128, 256]),
    etp=st.sampled_from([1, 2]),
    mbs=st.sampled_from([1, 2, 3]),
    recompute=st.sampled_from([(), ("moe",), ("mhc",), ("full",), ("core_attn",), ("full", "moe_act")]),
    offload=st.sampled_from([(), ("expert_fc1",), ("attn_norm",), ("attn_proj",), ("qkv_linear",)]),
    dispatcher=st.sampled_from(["alltoall", "flex", "allgather"]),
    flex_backend=st.sampled_from([None, "deepep", "hybridep", "ncclep"]),
    capacity_factor=st.sampled_from([None, 1.0]),
    use_tp_pp_dp_mapping=st.booleans(),
    optim=st.sampled_from(["fp32", "bf16", "bf16_moments", "fp8"]),
)


@settings(max_examples=150, deadline=None)
@given(a=_layouts, b=_layouts)
def test_rules_read_only_the_fields_they_declare(a, b):
    for r in R.RULES:
        if r.phase != "layout":
            continue
        mixed = replace(b, **{f: getattr(a, f) for f in r.needs})
        assert r.violated(ctx(a)) == r.violated(ctx(mixed)), r.id


_legal = st.builds(
    Layout,
    tp=st.just(1),
    pp=st.sampled_from([1, 2, 4, 8]),
    vpp=st.sampled_from([1, 2]),
    cp=st.sampled_from([1, 2, 4]),
    ep=st.sampled_from([8, 32, 64]),
    mbs=st.sampled_from([1, 2]),
    recompute=st.sampled_from([(), ("moe_act",), ("mhc", "mla_up_proj"), ("full",)]),
    offload=st.sampled_from([(), ("expert_fc1",)]),
    dispatcher=st.sampled_from(["alltoall", "allgather", "flex"]),
    capacity_factor=st.sampled_from([None, 1.5]),
    optim=st.sampled_from(["fp32", "bf16", "bf16_moments"]),
)


def _fix(lay: Layout) -> Layout:
    backend = "hybridep" if lay.dispatcher == "flex" else None
    return replace(lay, flex_backend=backend, vpp=1 if lay.pp == 1 else lay.vpp)


@settings(max_examples=60, deadline=None)
@given(a=_legal, b=_legal)
def test_argv_rules_read_only_the_knobs_they_declare(a, b):
    """plan() checks each argv rule once per value of its `needs`: argv.py must agree."""
    from orchestrator.plan.planner import _Env

    env = _Env(MODEL, HW, STAGE, None, 1.0, "")
    a = _fix(a)
    for r in R.by_phase("argv"):
        mixed = _fix(replace(b, **{f: getattr(a, f) for f in r.needs if f != "flex_backend"}))
        ca, cm = ctx(a, argv=env.argv(a)), ctx(mixed, argv=env.argv(mixed))
        assert ca.argv and cm.argv
        assert r.violated(ca) == r.violated(cm), r.id


def test_a_lifted_rule_is_not_checked_and_only_a_fix_can_lift_one():
    """stage.lifted_rules (set from preflight's evidence) removes exactly the rules a Megatron fix removes."""
    held = R.active(STAGE)
    assert R.BY_ID[R.FULL_RECOMPUTE_HASH_MHC] in held and held == R.RULES
    lifted = R.active(replace(STAGE, lifted_rules=[R.FULL_RECOMPUTE_HASH_MHC]))
    assert [r.id for r in R.RULES if r not in lifted] == [R.FULL_RECOMPUTE_HASH_MHC]
    with pytest.raises(ValueError, match="only rules a Megatron fix removes"):
        R.active(replace(STAGE, lifted_rules=["mcore.dense_grid"]))
    notes = R.lift_notes(STAGE)
    assert len(notes) == 1 and "holds until preflight finds" in notes[0] and "#6704" in notes[0]
    assert "lifted" in R.lift_notes(replace(STAGE, lifted_rules=[R.FULL_RECOMPUTE_HASH_MHC]))[0]


@pytest.mark.megatron
@pytest.mark.long  # imports Megatron's own code
@pytest.mark.parametrize(
    ("optimizer", "distributed", "optim"), [("sgd", True, "bf16"), ("adam", False, "bf16"), ("adam", True, "bf16")]
)
def test_the_precision_aware_rule_rejects_what_megatron_rejects(optimizer, distributed, optim):
    """mcore.precision_aware_needs_adam_distopt fires exactly where Megatron's OptimizerConfig asserts (dev
    megatron/core/optimizer/optimizer_config.py:519-525; megatron-core 0.19.2, installed here, asserts the same)."""
    from tests.megatron_env import import_megatron

    import_megatron()
    from megatron.core.optimizer import OptimizerConfig

    rule = R.BY_ID["mcore.precision_aware_needs_adam_distopt"]
    fires = rule.violated(
        ctx(lay(optim=optim), stage={"use_distributed_optimizer": distributed}, model={"optimizer": optimizer})
    )
    try:
        OptimizerConfig(
            optimizer=optimizer, use_distributed_optimizer=distributed, use_precision_aware_optimizer=optim != "fp32"
        )
        megatron_rejects = False
    except AssertionError:
        megatron_rejects = True
    except RuntimeError as e:  # past the assertions: the optimizer then wants TE's FusedAdam, absent on a CPU box
        assert "FusedAdam" in str(e)
        megatron_rejects = False
    assert fires == megatron_rejects
