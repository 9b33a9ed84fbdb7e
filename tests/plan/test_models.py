"""Properties of the analytic models (hypothesis) and their cross-checks against each other."""

import dataclasses
import itertools
import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.core.schema import HardwareConfig, ModelConfig, RecipeConfig, StageConfig
from orchestrator.plan import argv as A
from orchestrator.plan import flops, memory, moe, params, pipeline, steptime
from orchestrator.plan.layout import Layout, groups

MODEL = ModelConfig()
HW = HardwareConfig()  # H100 80 GB
STAGE = StageConfig()  # 1k: 1024 GPUs, B 4096, S 8192
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RECOMPUTE = [(), ("mla_up_proj", "mhc"), ("moe_act",), ("mla_up_proj", "mhc", "moe_act"), ("moe",), ("full",)]
COSTS, FIRST, LAST = flops.block_costs(MODEL, STAGE.seq_length)


def split_for(lay, model=MODEL, stage=STAGE):
    costs, first, last = flops.block_costs(model, stage.seq_length, params.effective_layers(model, stage))
    return pipeline.split_blocks(len(costs), lay.pp * lay.vpp, costs, first, last)


def predict(lay, model=MODEL, hw=HW, stage=STAGE, factors=None, recipe=None):
    g = groups(lay, stage.gpus, stage.global_batch)
    bps = split_for(lay, model, stage)
    mem = memory.stage_memory(model, hw, stage, lay, g, bps)
    ep_nodes = moe.min_nodes(lay.ep, stage.gpus_per_node)
    cp_nodes = moe.min_nodes(lay.cp, stage.gpus_per_node)
    t = steptime.step_time(model, hw, stage, lay, g, bps, ep_nodes, cp_nodes, factors=factors, recipe=recipe)
    return g, bps, mem, t


@st.composite
def legal_layouts(draw):
    pp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    vpp = draw(st.sampled_from([1, 2, 4])) if pp > 1 else 1
    lay = Layout(
        tp=1,
        pp=pp,
        vpp=vpp,
        cp=draw(st.sampled_from([1, 2, 4, 8])),
        ep=draw(st.sampled_from([8, 16, 32, 64, 128])),
        etp=1,
        mbs=draw(st.sampled_from([1, 2])),
        recompute=draw(st.sampled_from(RECOMPUTE)),
        dispatcher=draw(st.sampled_from(["alltoall", "flex", "allgather"])),
    )
    if lay.dispatcher == "flex":
        lay = dataclasses.replace(lay, flex_backend=draw(st.sampled_from(["deepep", "hybridep"])))
    assume(pp * vpp <= 61)
    g = groups(lay, STAGE.gpus, STAGE.global_batch)
    assume(g.legal)
    return lay


# --- params -----------------------------------------------------------------------------------------


def test_param_counts_add_up():
    pc = params.param_counts(MODEL)
    assert pc.p_expert == 66_060_288
    assert len(pc.blocks) == 61
    assert pc.routed_experts == 61 * 384 * pc.p_expert
    parts = pc.embedding + pc.output_head + sum(b.total for b in pc.blocks) + pc.mtp_layers * pc.mtp
    assert pc.total == parts
    # a token activates k routed + 1 shared expert per block, never all 384
    assert pc.active < pc.total / 20
    assert {b.ratio for b in pc.blocks} == {4, 128}
    assert pc.mtp_block is not None and pc.mtp_block.ratio == 0


def test_slice_stage_builds_fewer_blocks():
    sl = dataclasses.replace(STAGE, num_layers_override=8)
    assert params.effective_layers(MODEL, sl) == 8
    assert params.effective_layers(MODEL, STAGE) == 61
    small = params.param_counts(MODEL, 8)
    assert len(small.blocks) == 8 and small.total < params.param_counts(MODEL).total / 5


def test_model_key_sees_in_place_edits():
    m = ModelConfig()
    before = params.param_counts(m).total
    m.num_experts = 256
    assert params.param_counts(m).total < before


# --- moe ----------------------------------------------------------------------------------------------


@given(ep=st.sampled_from([32, 64, 128, 192, 384]), layers=st.integers(1, 16))
def test_routed_weights_fall_with_ep(ep, layers):
    pe = params.p_expert(MODEL)
    a = moe.routed_weight_gb(layers, 384, ep, 1, pe)
    assert a == pytest.approx(layers * moe.experts_per_rank(384, ep) * pe * 2 / 1e9)
    assert moe.routed_weight_gb(layers, 384, ep, 2, pe) == pytest.approx(a / 2)  # ETP splits experts


@given(sigma=st.floats(0.01, 1.5), ep=st.sampled_from([8, 32, 64, 128]))
def test_hot_rank_is_above_the_mean_and_grows_with_skew(sigma, ep):
    per = 384 // ep
    f = moe.hot_rank_factor(sigma, per, ep)
    assert f > 1.0
    assert moe.hot_rank_factor(sigma * 1.5, per, ep) > f
    assert moe.hot_rank_factor(0.0, per, ep) == 1.0
    tg = moe.t_group(ep, 1, 8192, 1)
    assert moe.dispatch_buffer_gb(tg, 6, ep, 7168, f) > moe.dispatch_buffer_gb(tg, 6, ep, 7168, 1.0)
    # a capacity factor of 1 caps the hot rank at the mean (rank_skew, the one place the cap is applied)
    assert moe.rank_skew(sigma, 384, ep) == f and moe.rank_skew(sigma, 384, ep, capacity_factor=1.0) == 1.0
    assert moe.dispatch_buffer_gb(tg, 6, ep, 7168, moe.rank_skew(sigma, 384, ep, 1.0)) == moe.dispatch_buffer_gb(
        tg, 6, ep, 7168
    )


# --- pipeline ----------------------------------------------------------------------------------------


@SETTINGS
@given(n=st.integers(1, 80), data=st.data())
def test_split_sums_and_every_segment_gets_a_block(n, data):
    k = data.draw(st.integers(1, n))
    costs = data.draw(st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n))
    first, last = data.draw(st.floats(0, 5)), data.draw(st.floats(0, 20))
    out = pipeline.split_blocks(n, k, costs, first, last)
    assert len(out) == k and sum(out) == n and min(out) >= 1
    assert out == pipeline.split_blocks(n, k, costs, first, last)  # deterministic


def _optimal_max(costs, k, first, last):
    """Brute force: the smallest achievable slowest-segment load."""
    n, best = len(costs), float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0,) + cuts + (n,)
        loads = [sum(costs[b[i] : b[i + 1]]) for i in range(k)]
        loads[0] += first
        loads[-1] += last
        best = min(best, max(loads))
    return best


@SETTINGS
@given(data=st.data())
def test_split_minimizes_the_slowest_segment(data):
    n = data.draw(st.integers(2, 9))
    k = data.draw(st.integers(1, n))
    costs = data.draw(st.lists(st.floats(0.5, 4.0), min_size=n, max_size=n))
    first, last = data.draw(st.floats(0, 2)), data.draw(st.floats(0, 6))
    out = pipeline.split_blocks(n, k, costs, first, last)
    loads = pipeline._loads(costs, out, first, last)
    assert max(loads) == pytest.approx(_optimal_max(costs, k, first, last), rel=1e-6)


def test_split_puts_fewer_blocks_on_the_last_segment_for_head_and_mtp():
    split = pipeline.split_blocks(61, 8, COSTS, FIRST, LAST)
    assert sum(split) == 61 and split[-1] < max(split)


@SETTINGS
@given(pp=st.sampled_from([1, 2, 4, 8, 16]), vpp=st.sampled_from([1, 2, 3, 4]))
def test_layer_pattern_has_61_blocks_in_pp_vpp_segments(pp, vpp):
    assume(pp * vpp <= 61)
    split = pipeline.split_blocks(61, pp * vpp, COSTS, FIRST, LAST)
    pat = pipeline.layer_pattern(MODEL, split)
    assert pipeline.count_blocks(pat) == split
    assert sum(pipeline.count_blocks(pat)) == 61 and len(pipeline.count_blocks(pat)) == pp * vpp
    main, *mtp = pat.split("/")
    assert mtp == ["WE"]  # one MTP depth, window-only attention (ratio entry 61 is 0)
    assert main.replace("|", "")[:6] == "HEHECE"  # ratios 128, 128, 4 ...
    assert set(main) <= set("CHWE|")


def test_layer_pattern_dense_blocks_and_mtp_depths():
    m = dataclasses.replace(MODEL, num_dense_layers=3, mtp_num_layers=2)
    pat = pipeline.layer_pattern(m, [3, 58])
    assert pat.startswith("H-H-C-|HE") and pat.endswith("/WE/WE")
    assert pipeline.mtp_depths(pat) == 2 and pipeline.count_blocks(pat) == [3, 58]


@given(p=st.integers(2, 64), m=st.integers(1, 512), v=st.integers(1, 8))
def test_bubble_monotone(p, m, v):
    b = pipeline.bubble(p, m, v)
    assert 0 < b < 1
    assert pipeline.bubble(p, m + 1, v) < b  # more microbatches fill the pipeline
    assert pipeline.bubble(p + 1, m, v) > b  # deeper pipelines idle longer
    assert pipeline.bubble(p, m, v + 1) < b  # interleaving shrinks it
    assert pipeline.bubble(1, m, v) == 0.0


def test_microbatches_rejects_non_divisible_batch():
    assert pipeline.microbatches(4096, 1, 128) == 32
    with pytest.raises(ValueError):
        pipeline.microbatches(4096, 3, 128)


# --- flops ---------------------------------------------------------------------------------------------


def test_model_flops_count_active_experts_not_all_parameters():
    f = flops.step_flops(MODEL, STAGE, Layout())
    pc = params.param_counts(MODEL)
    dense_approx = 6 * pc.total * f.tokens  # the guide's warning: 6 x 1.6T x tokens
    assert f.model_flops < dense_approx / 20
    assert f.model_flops == pytest.approx(6 * pc.active * f.tokens, rel=0.25)
    assert f.per_token * f.tokens == pytest.approx(f.model_flops)
    assert sum(f.breakdown.values()) == pytest.approx(f.model_flops)
    assert f.recompute_flops == 0


def test_v4_attention_is_far_below_dense_seq_squared():
    prof = flops.profile(MODEL, 8192)
    h = MODEL.num_attention_heads * MODEL.v_head_dim
    dense_causal = 4 * h * 8192 / 2  # per token, every layer, if attention were dense
    assert all(b.attn < dense_causal / 4 for b in prof.blocks)
    csa = [b for b, r in zip(prof.blocks, params.block_ratios(MODEL)) if r == 4]
    hca = [b for b, r in zip(prof.blocks, params.block_ratios(MODEL)) if r == 128]
    assert csa[0].attn > hca[0].attn  # CSA attends top-k compressed entries + indexer; HCA few


def test_recompute_flops_reported_separately_and_ordered():
    f = {rc: flops.step_flops(MODEL, STAGE, Layout(recompute=rc)) for rc in RECOMPUTE}
    assert len({x.model_flops for x in f.values()}) == 1  # recompute never inflates model FLOPs
    assert f[()].recompute_flops == 0
    assert 0 < f[("mla_up_proj", "mhc")].recompute_flops < f[("moe",)].recompute_flops < f[("full",)].recompute_flops
    assert f[("full",)].recompute_flops == pytest.approx(f[()].model_flops / 3, rel=0.1)  # ~ one forward


def test_mfu_and_peak_label():
    f = flops.step_flops(MODEL, STAGE, Layout())
    t = f.model_flops / (1024 * 989e12 * 0.4)
    assert flops.mfu(f, t, 1024, HW) == pytest.approx(0.4)
    assert flops.mfu(f, t, 1024, HW, "fp8") == pytest.approx(0.4 * 989 / 1979)
    assert "BF16" in flops.peak_label(HW) and "989" in flops.peak_label(HW) and "no sparsity" in flops.peak_label(HW)
    with pytest.raises(ValueError):
        flops.peak_label(HW, "int4")


# --- memory --------------------------------------------------------------------------------------------


def heavy(lay, stage=STAGE):
    g = groups(lay, stage.gpus, stage.global_batch)
    return memory.heaviest(memory.stage_memory(MODEL, HW, stage, lay, g, split_for(lay, stage=stage)))


def test_routed_weights_match_the_guide_lower_bound():
    """PP8 + a rank with 8 MoE blocks holds exactly the guide's 8-layer routed weights."""
    for ep, gb in ((32, 12.68), (64, 6.34), (128, 3.17)):
        lay = Layout(pp=8, ep=ep, recompute=("full",))
        g = groups(lay, 1024, 4096)
        mems = memory.stage_memory(MODEL, HW, STAGE, lay, g, split_for(lay))
        eight = [s for s in mems if s.moe_blocks == 8]
        assert eight and round(eight[0].routed_weights, 2) == gb


@SETTINGS
@given(lay=legal_layouts())
def test_memory_breakdown_is_positive_and_sums(lay):
    g = groups(lay, STAGE.gpus, STAGE.global_batch)
    bps = split_for(lay)
    mems = memory.stage_memory(MODEL, HW, STAGE, lay, g, bps)
    assert len(mems) == lay.pp
    assert sum(s.blocks for s in mems) == 61
    for s in mems:
        assert all(v >= 0 for v in s.breakdown().values())
        assert s.total == pytest.approx(sum(s.breakdown().values()))
    top = memory.heaviest(mems)
    assert memory.is_feasible(mems, STAGE, HW) == (top.total + STAGE.memory_margin_gb <= HW.hbm_gb)
    assert mems[0].embedding > 0 and mems[-1].head > 0


@SETTINGS
@given(lay=legal_layouts())
def test_more_ep_means_fewer_routed_weights(lay):
    bigger = dataclasses.replace(lay, ep=lay.ep * 2)
    assume(384 % bigger.ep == 0 and groups(bigger, STAGE.gpus, STAGE.global_batch).legal)
    a, b = heavy(lay), heavy(bigger)
    assert b.routed_weights < a.routed_weights
    assert b.routed_weights == pytest.approx(a.routed_weights / 2)


@SETTINGS
@given(lay=legal_layouts())
def test_recompute_lowers_activations(lay):
    acts = {rc: heavy(dataclasses.replace(lay, recompute=rc)).activations for rc in RECOMPUTE}
    assert acts[("mla_up_proj", "mhc")] < acts[()]
    assert acts[("moe_act",)] < acts[()]
    assert acts[("mla_up_proj", "mhc", "moe_act")] < acts[("mla_up_proj", "mhc")]
    assert acts[("full",)] < acts[("mla_up_proj", "mhc", "moe_act")]


@SETTINGS
@given(lay=legal_layouts())
def test_distributed_optimizer_shards_optimizer_state(lay):
    g = groups(lay, STAGE.gpus, STAGE.global_batch)
    assume(g.d_a * lay.cp > 1 or g.d_e > 1)
    plain = dataclasses.replace(STAGE, use_distributed_optimizer=False)
    assert heavy(lay).optimizer < heavy(lay, plain).optimizer


def test_cp_divides_activations_and_adam_costs_more_than_muon():
    a = heavy(Layout(pp=8, ep=64, recompute=("full",), optim="fp32"))  # MODEL.optimizer: adam, FP32 state
    b = heavy(Layout(pp=8, ep=64, cp=4, recompute=("full",), optim="fp32"))
    assert b.activations < a.activations / 3
    muon = dataclasses.replace(MODEL, optimizer="muon")
    lay = Layout(pp=8, ep=64, recompute=("full",))
    g = groups(lay, 1024, 4096)
    m_muon = memory.heaviest(memory.stage_memory(muon, HW, STAGE, lay, g, split_for(lay)))
    assert m_muon.optimizer < a.optimizer
    assert MODEL.optimizer == "adam"  # ModelConfig.optimizer: Megatron dev's DSv4-Pro recipe trains with Adam


def test_full_recompute_keeps_both_layer_inputs_of_every_block():
    """Full recompute with --recompute-num-layers 1 checkpoints every layer's input (megatron/core/recompute.py:
    147-156 at dev d48bd6be0a85), and on the hybrid stack the attention symbol and the MoE symbol of a block
    are two layers (megatron/core/models/hybrid/hybrid_block.py:617-618, run through checkpointed_forward at
    :952-953), each input the n-stream mHC tensor: PP rank 0 of config A keeps 2 x n x h per block and token."""
    lay = Layout(pp=8, ep=64, recompute=("full",))
    g = groups(lay, STAGE.gpus, STAGE.global_batch)
    bps = split_for(lay)
    rank0 = memory.stage_memory(MODEL, HW, STAGE, lay, g, bps)[0]
    n, h, tokens = MODEL.hyper_connection_streams, MODEL.hidden_size, STAGE.seq_length  # b = 1, CP = 1, TP = 1
    working = max(
        sum(memory.block_activation_elems(MODEL, r, params.is_moe_block(MODEL, i)).values())
        for i, r in enumerate(params.block_ratios(MODEL))
    )
    live = memory.in_flight(0, lay.pp, lay.vpp, g.m)  # 8 microbatches in flight on PP rank 0
    kept = live * tokens * bps[0] * 2 * n * h * memory.ACT_BYTES
    assert (live, bps[0]) == (8, rank0.blocks)
    assert rank0.activations * 1e9 == pytest.approx(kept + tokens * working * memory.ACT_BYTES)
    one_input = live * tokens * bps[0] * n * h * memory.ACT_BYTES / 1e9  # what keeping one input per block said
    assert one_input == pytest.approx(30.1, abs=0.1)  # config A on rank 0: ~30 GB under-predicted before


def test_interleaving_keeps_more_activations_alive_on_rank_0():
    assert memory.in_flight(0, 8, 2, 32) > memory.in_flight(0, 8, 1, 32) == 8
    assert memory.in_flight(7, 8, 1, 32) == 1
    assert memory.in_flight(0, 8, 1, 4) == 4  # never more than m


def test_some_1k_layouts_fit_an_h100_and_the_guide_config_a_does_not():
    assert not memory.is_feasible(heavy(Layout(pp=8, ep=64)), STAGE, HW)
    assert not memory.is_feasible(heavy(Layout(pp=8, ep=64, recompute=("full",))), STAGE, HW)
    assert memory.is_feasible(heavy(Layout(pp=16, ep=64, cp=4, recompute=("full",))), STAGE, HW)


# --- step time ------------------------------------------------------------------------------------------


@SETTINGS
@given(lay=legal_layouts(), data=st.data())
def test_step_time_positive_and_factors_scale_their_component(lay, data):
    _, _, _, t = predict(lay)
    assert t.total_s > 0 and set(t.components) == set(steptime.COMPONENTS)
    assert all(v >= 0 for v in t.components.values())
    assert t.total_s == pytest.approx(sum(t.components.values()))
    assert t.components["compute"] > 0
    comp = data.draw(st.sampled_from(steptime.COMPONENTS))
    x = data.draw(st.floats(0.5, 3.0))
    _, _, _, scaled = predict(lay, factors={comp: x})
    stage = sum(t.components[c] for c in steptime.PER_MICROBATCH)
    for c in steptime.COMPONENTS:
        want = t.components[c] * (x if c == comp else 1.0)
        if c == "bubble" and comp in steptime.PER_MICROBATCH and stage > 0:
            # the bubble (m x the stage time x f / (1 - f)) follows the scaled stage time
            want *= (stage + t.components[comp] * (x - 1.0)) / stage
        assert scaled.components[c] == pytest.approx(want)


def test_unknown_factor_is_an_error():
    with pytest.raises(ValueError, match="unknown"):
        predict(Layout(pp=8, ep=64), factors={"comput": 1.2})


def test_step_time_reacts_to_the_guides_levers():
    # the all-to-all's own levers, with the padded dispatcher: no host wait (steptime.host_wait; its own tests in
    # tests/plan/test_host_wait.py), which no link or overlap changes
    base = Layout(pp=8, ep=64, cp=4, recompute=("full",), capacity_factor=1.0)
    _, _, _, t = predict(base)
    # no CP: no CP exchange; CP>1: some
    assert predict(dataclasses.replace(base, cp=1))[3].components["cp_exchange"] == 0
    assert t.components["cp_exchange"] > 0
    # full recompute costs compute time
    assert predict(dataclasses.replace(base, recompute=()))[3].components["compute"] < t.components["compute"]
    # DeepEP sends a token once per remote node: less exposed all-to-all than plain alltoall
    flex = predict(dataclasses.replace(base, dispatcher="flex", flex_backend="deepep"))[3]
    assert flex.components["a2a"] < t.components["a2a"]
    # EP inside one node: NVLink, far cheaper than across nodes
    assert predict(dataclasses.replace(base, ep=8))[3].components["a2a"] < t.components["a2a"] / 3
    # overlap hides all-to-all
    hw = dataclasses.replace(HW, a2a_overlap=0.5)
    assert predict(base, hw=hw)[3].components["a2a"] == pytest.approx(t.components["a2a"] / 2)
    # the bubble is (PP-1)/VPP slowest-stage microbatch times
    g = groups(base, 1024, 4096)
    per_mb = t.stage_times_s[t.slowest_stage]
    assert t.components["bubble"] == pytest.approx(per_mb * 7)
    assert t.components["compute"] + t.components["a2a"] + t.components["cp_exchange"] + t.components[
        "pp_p2p"
    ] == pytest.approx(g.m * per_mb)


def test_grad_sync_hides_exactly_what_the_recipe_overlaps():
    """The step time hides gradient sync only as far as the argv turns overlap on (argv.overlaps): the
    reduce-scatter with --overlap-grad-reduce, the all-gather with --overlap-param-gather (FP32 main grads)."""
    lay = Layout(pp=8, ep=64, recompute=("full",), optim="fp32")
    on = predict(lay)[3].components["grad_sync"]
    off = predict(lay, recipe=RecipeConfig(overlap_grad_reduce=False))[3].components["grad_sync"]
    no_gather = predict(lay, recipe=RecipeConfig(overlap_param_gather=False))[3].components["grad_sync"]
    assert on > 0 and on == pytest.approx(off * (1 - HW.grad_sync_overlap))  # both parts hidden alike
    assert on < no_gather < off
    grad, weight = memory.GRAD_BYTES, memory.WEIGHT_BYTES  # reduce-scatter FP32 grads, all-gather BF16 params
    assert no_gather == pytest.approx(off * (grad * (1 - HW.grad_sync_overlap) + weight) / (grad + weight))
    for recipe, flags in (
        (RecipeConfig(), {"--overlap-grad-reduce", "--overlap-param-gather"}),
        (RecipeConfig(overlap_param_gather=False), {"--overlap-grad-reduce"}),
        (RecipeConfig(overlap_grad_reduce=False), set()),
    ):
        pattern = pipeline.layer_pattern(MODEL, split_for(lay))
        argv = A.megatron_argv(MODEL, STAGE, lay, layer_pattern=pattern, train_iters=1, recipe=recipe)
        assert {f for f in argv if f.startswith("--overlap")} == flags
    plain = dataclasses.replace(STAGE, use_distributed_optimizer=False)  # Megatron: param gather needs it
    assert A.overlaps(RecipeConfig(), plain) == A.Overlap(grad_reduce=True, param_gather=False)


def test_smaller_expert_batches_run_less_efficiently():
    assert steptime.expert_efficiency(8192) > steptime.expert_efficiency(2048) > steptime.expert_efficiency(256)


def test_tiny_model_smoke_stage_predicts():
    tiny = ModelConfig(
        name="tiny",
        num_layers=9,
        hidden_size=512,
        num_attention_heads=8,
        kv_channels=64,
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_pos_emb_head_dim=16,
        v_head_dim=64,
        o_groups=2,
        o_lora_rank=64,
        csa_compress_ratios=[128, 128, 4, 128, 4, 128, 4, 128, 4, 0],
        ffn_hidden_size=1024,
        num_experts=64,
        moe_ffn_hidden_size=256,
        moe_shared_expert_intermediate_size=256,
        moe_n_hash_layers=1,
        vocab_size=32000,
    )
    smoke = StageConfig(name="smoke", gpus=32, global_batch=64, seq_length=4096)
    lay = Layout(pp=2, ep=8)
    _g, bps, mem, t = predict(lay, model=tiny, stage=smoke)
    assert sum(bps) == 9 and t.total_s > 0 and memory.heaviest(mem).total < HW.hbm_gb


def test_the_models_answer_every_layout_the_planner_asks_and_the_same_again():
    """The planner evaluates >= 20k layouts, so the models cache what they share: a second evaluation (from
    the cache) gives the first's answer. Their speed is `make bench` (tests/bench/bench_plan.py), never a test."""
    lays = [
        Layout(pp=pp, vpp=v, cp=cp, ep=ep, recompute=rc)
        for pp, v, cp, ep, rc in itertools.product([4, 8, 16], [1, 2], [1, 2, 4], [32, 64, 128], RECOMPUTE)
    ]
    lays = [x for x in lays if groups(x, 1024, 4096).legal]
    prepared = [(x, groups(x, 1024, 4096), split_for(x)) for x in lays]
    assert prepared
    first = [
        (memory.stage_memory(MODEL, HW, STAGE, x, g, bps), steptime.step_time(MODEL, HW, STAGE, x, g, bps, 8, 1))
        for x, g, bps in prepared
    ]
    again = [
        (memory.stage_memory(MODEL, HW, STAGE, x, g, bps), steptime.step_time(MODEL, HW, STAGE, x, g, bps, 8, 1))
        for x, g, bps in prepared
    ]
    assert again == first
    assert all(t.total_s > 0 for _, t in first) and all(flops.step_flops(MODEL, STAGE, x) for x, _, _ in prepared)


@pytest.mark.long
@pytest.mark.megatron
@pytest.mark.parametrize("pp,vpp", [(8, 1), (16, 1), (4, 4), (8, 2)])
def test_layer_pattern_parses_with_megatrons_own_parser(pp, vpp):
    """megatron-core 0.19.2 knows no C/H/W (dev symbols), so they are mapped to its DSA symbol D;
    the '|' segments and '/' MTP depths are what its parser must read back."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("megatron") is None:
        msg = "megatron-core is not installed (make install)"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    from tests.megatron_env import import_megatron

    import_megatron()

    hla = importlib.import_module("megatron.core.models.hybrid.hybrid_layer_allocation")
    split = pipeline.split_blocks(61, pp * vpp, COSTS, FIRST, LAST)
    pat = pipeline.layer_pattern(MODEL, split).translate(str.maketrans("CHW", "DDD"))
    assert hla.get_hybrid_total_layer_count(pat) == 2 * 61  # attention + MoE layer per block
    assert hla.get_hybrid_total_pipeline_segment_count(pat) == pp * vpp
    parsed = hla.parse_hybrid_pattern(pat)
    assert parsed.mtp_pattern == "DE" and parsed.mtp_num_depths == MODEL.mtp_num_layers
    assert [len(s) // 2 for s in parsed.main_pattern.split("|")] == split
