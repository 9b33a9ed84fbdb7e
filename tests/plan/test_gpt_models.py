"""The models beyond V4-Pro (conf/model/dsv3*.yaml, qwen3_*.yaml, gpt_oss_120b.yaml) on the GPT path: their
parameter counts against the model cards, their FLOPs against Megatron's own count, the V4 attention's rules
applying to V4 only, the flags Megatron's parser and validator accept, and the NVL72 pricing of EP groups."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from orchestrator.config import compose
from orchestrator.core.schema import StageConfig
from orchestrator.job import megatron_check as MC
from orchestrator.plan import argv as A
from orchestrator.plan import flops, params, planner, ranks, steptime
from orchestrator.plan.layout import Layout
from orchestrator.plan.planner import Planned, Rejected, evaluate

GPT_MODELS = ("dsv3", "dsv3_nomtp", "qwen3_235b_a22b", "qwen3_30b_a3b", "gpt_oss_120b")


def model(name: str):
    return compose([f"model={name}"]).cfg.model


def hardware(name: str):
    return compose([f"hardware={name}"]).cfg.hardware


@pytest.mark.parametrize("name", GPT_MODELS)
def test_parameter_counts_match_the_model_cards(name):
    """Total parameters (MTP excluded, as the cards count) within 0.5% of the card's, active within 12% (the cards
    differ on whether the embedding row counts as activated)."""
    m = model(name)
    pc = params.param_counts(m)
    main = pc.total - pc.mtp_layers * pc.mtp
    assert main / 1e9 == pytest.approx(m.total_params_b, rel=0.005)
    assert pc.active / 1e9 == pytest.approx(m.active_params_b, rel=0.12)
    assert not params.is_v4(m) and pc.mhc == 0  # no mHC, no compressor or indexer on the GPT path


def test_dsv3_with_and_without_mtp_differ_only_by_the_mtp_depth():
    a, b = model("dsv3"), model("dsv3_nomtp")
    assert (a.mtp_num_layers, b.mtp_num_layers) == (1, 0)
    assert replace(b, name="dsv3", mtp_num_layers=1) == a
    pa, pb = params.param_counts(a), params.param_counts(b)
    assert pa.total - pb.total == pa.mtp > 11e9  # one MoE block + eh_proj: ~11.7B


def _stage(**kw) -> StageConfig:
    base = {"name": "t", "gpus": 8, "global_batch": 64, "seq_length": 4096, "packed_sequences": False}
    return StageConfig(**{**base, **kw})


def _args(m, stage: StageConfig, lay: Layout, arch: int = MC.HOPPER_ARCH):
    """Megatron's own parse_args + validate_args on the planner's argv for this layout."""
    planned = evaluate(m, hardware("h100"), stage, lay, check_memory=False)
    assert isinstance(planned, Planned), getattr(planned, "rule_ids", None)
    argv = A.megatron_argv(m, stage, lay, layer_pattern=planned.prediction.layer_pattern, train_iters=10)
    MC.import_megatron()
    args = MC.validated_args(MC.for_parser(argv)[0], stage.gpus, arch=arch)
    args.padded_vocab_size = m.vocab_size  # a multiple of 128 x TP for every model here (what build_tokenizer pads to)
    return args, planned


@pytest.mark.long
@pytest.mark.megatron
@pytest.mark.parametrize("name", GPT_MODELS)
def test_model_flops_are_megatrons_own_count(name):
    """megatron/training/training.py num_floating_point_operations (megatron-core 0.19.2: transformer_flops with its
    MLA / GQA attention, MoE, logits and MTP terms) on the args Megatron parses from our argv, against
    flops.step_flops. The differences are the three the flops docstring names, each taken out here: the router
    GEMM, the sliding window, and the third matrix of a quick-GEGLU expert (Megatron counts 3 only with --swiglu)."""
    m = replace(model(name), window_size=None)  # Megatron's count attends S/2 keys in every layer
    stage = _stage()
    lay = Layout(ep=8, mbs=1)
    args, _ = _args(m, stage, lay)
    training = importlib.import_module("megatron.training.training")
    theirs = training.num_floating_point_operations(args, stage.global_batch)
    ours = flops.step_flops(m, stage, lay)
    prof = flops.profile(m, stage.seq_length)
    tokens = stage.global_batch * stage.seq_length
    blocks = list(prof.blocks) + ([prof.mtp_block] * prof.mtp_layers if prof.mtp_block else [])
    router = sum(b.router for b in blocks)
    glu = sum(b.expert + b.shared + b.mlp for b in blocks) / 3 if m.glu_activation == "quick_geglu" else 0.0
    expected = ours.model_flops - 3 * tokens * (router + glu)
    assert theirs == pytest.approx(expected, rel=2e-3)
    assert ours.model_flops > theirs  # the router always, GPT-OSS's third GLU matrix


def test_a_sliding_window_lowers_attention_flops_and_megatron_does_not_count_it():
    m = model("gpt_oss_120b")
    full = flops.profile(replace(m, window_size=None), 4096)
    win = flops.profile(m, 4096)
    windowed = [params.is_window_block(m, i) for i in range(m.num_layers)]
    assert windowed[:4] == [True, False, True, False]  # layer_number % 2 == 0 attends fully
    for w, a, b in zip(windowed, win.blocks, full.blocks):
        assert (a.attn < b.attn / 10) if w else a.attn == b.attn
        assert a.gemm == b.gemm and a.expert == b.expert


@pytest.mark.long
@pytest.mark.parametrize("name", ("dsv3", "qwen3_235b_a22b"))
def test_the_v4_attention_rules_apply_to_v4_only(name):
    """TP2 is legal for DeepSeek-V3's MLA and Qwen3's GQA, illegal for V4's hybrid attention (v4.tp1_with_te);
    so are core_attn recompute and CP without packed input (v4.no_core_attn_recompute, v4.cp_needs_packed_thd)."""
    stage = _stage(gpus=64, global_batch=256)
    hw = hardware("h100")
    lay = Layout(tp=2, pp=2, ep=8, recompute=("core_attn",), cp=2)
    gpt = evaluate(model(name), hw, stage, lay, check_memory=False)
    v4 = evaluate(model("dsv4_pro"), hw, stage, lay, check_memory=False)
    assert isinstance(gpt, Planned), getattr(gpt, "rule_ids", None)
    assert isinstance(v4, Rejected)
    assert {"v4.tp1_with_te", "v4.no_core_attn_recompute", "v4.cp_needs_packed_thd"} <= set(v4.rule_ids)


def test_gqa_groups_bound_tp():
    """Qwen3-235B has 4 KV groups: TP 3 splits none evenly (dev TC:1505-1512); TP 8 replicates them."""
    stage = _stage(gpus=48, global_batch=48)
    m = model("qwen3_235b_a22b")
    bad = evaluate(m, hardware("h100"), stage, Layout(tp=3, ep=8, pp=2), check_memory=False)
    assert isinstance(bad, Rejected) and "mcore.query_groups_div_tp" in bad.rule_ids


@pytest.mark.megatron
@pytest.mark.parametrize(
    ("name", "system", "precision", "lay"),
    [
        ("dsv3", "gb200", "mxfp8", Layout(tp=2, pp=4, vpp=2, ep=32, mbs=1, recompute=("mla_up_proj",))),
        ("dsv3_nomtp", "h100", "fp8", Layout(tp=2, pp=4, ep=64, recompute=("mla_up_proj", "mlp"))),
        ("qwen3_235b_a22b", "b200", "fp8_cs", Layout(tp=2, pp=8, vpp=4, ep=32, dispatcher="alltoall")),
        ("qwen3_30b_a3b", "gb300", "mxfp8", Layout(ep=8, mbs=4, dispatcher="flex", flex_backend="hybridep")),
        ("gpt_oss_120b", "b300", "bf16", Layout(ep=64, mbs=2, recompute=("layernorm", "moe_act"))),
    ],
)
@pytest.mark.long
def test_megatron_accepts_the_gpt_path_argv(name, system, precision, lay):
    """Megatron's parse_args + validate_args + optimizer/scheduler setup accept the planner's pretrain_gpt.py
    argv for each new model: its --pipeline-model-parallel-layout, MLA or GQA flags, --moe-layer-freq, the
    precision's --fp8-recipe (MXFP8 checked as a Blackwell part, sm_100), and none of the V4 path's flags.
    FP32 optimizer state: Megatron builds the precision-aware optimizer only from Transformer Engine's FusedAdam,
    which a CPU machine lacks (the BF16 path: test_the_precision_aware_optimizer_is_emitted_...)."""
    lay = replace(lay, optim="fp32", precision=precision)
    m, hw = model(name), hardware(system)
    stage = _stage(gpus=256, global_batch=1024, gpus_per_node=hw.gpus_per_node)
    planned = evaluate(m, hw, stage, lay, check_memory=False)
    assert isinstance(planned, Planned), getattr(planned, "rule_ids", None)
    argv = A.megatron_argv(m, stage, lay, layer_pattern=planned.prediction.layer_pattern, train_iters=10)
    assert not {"--hybrid-layer-pattern", "--spec", "--experimental-attention-variant", "--csa-compress-ratios"} & set(
        argv
    )
    if lay.pp > 1:
        assert A.parse_flags(argv)["pipeline_model_parallel_layout"] == planned.prediction.layer_pattern
    assert MC.check_candidate(argv, stage.gpus, arch=MC.HOPPER_ARCH if system == "h100" else 10) is None
    assert A.layout_from_argv(argv) == lay


def test_gpt_layout_puts_embedding_first_and_mtp_and_loss_last():
    from orchestrator.plan.pipeline import gpt_layout

    assert gpt_layout(model("dsv3"), [4, 2, 1]) == "Et*4|t*2|tmL"
    assert gpt_layout(model("dsv3_nomtp"), [3, 3]) == "Et*3|t*3L"


@pytest.mark.long
def test_an_ep_group_inside_one_nvl72_domain_runs_on_nvlink_even_across_hosts():
    """On GB200 NVL72 (4 GPUs per tray, 64-GPU blocks of the rack: ranks.allocated_domain) EP64 spans 16 hosts and
    one domain: its all-to-all is priced at NVLink. EP128 spans two domains and crosses the NIC. On B200 (8-GPU
    NVLink hosts) the same EP64 crosses the NIC."""
    m = model("qwen3_235b_a22b")
    assert ranks.allocated_domain(72, 4) == 64 and ranks.allocated_domain(8, 8) == 8

    def a2a(system: str, ep: int) -> float:
        hw = hardware(system)
        stage = _stage(gpus=256, global_batch=2048, gpus_per_node=hw.gpus_per_node)
        p = evaluate(m, hw, stage, Layout(pp=2, vpp=2, ep=ep), check_memory=False, routing_sigma=0.0)
        assert isinstance(p, Planned)
        assert p.prediction.ep_nodes == ep // hw.gpus_per_node
        return p.prediction.step_components["a2a"]

    nvl, nic = hardware("gb200").nvlink_gb_s, hardware("gb200").nic_gb_s
    gb_64, gb_128, b_64 = a2a("gb200", 64), a2a("gb200", 128), a2a("b200", 64)
    assert gb_64 < b_64 / 4  # NVLink (900 GB/s) against B200's 50 GB/s NICs
    assert gb_128 > gb_64 * nvl / nic / 4  # two domains: the remote share goes over the NIC


def test_each_precision_runs_at_its_own_peak():
    hw, h100 = hardware("gb300"), hardware("h100")
    assert flops.peak_tflops(hw, "mxfp8") == hw.peak_mxfp8_tflops == 5000
    assert flops.peak_tflops(hw, "fp8_cs") == flops.peak_tflops(hw, "fp8") == hw.peak_fp8_tflops
    assert not flops.has_precision(h100, "mxfp8") and flops.has_precision(h100, "fp8")
    with pytest.raises(ValueError, match="no MXFP8"):
        flops.peak_tflops(h100, "mxfp8")
    m = model("dsv3")
    stage = _stage(gpus=256, global_batch=1024, gpus_per_node=4)
    lay = Layout(pp=4, vpp=2, ep=64)
    t = {
        p: evaluate(m, hw, stage, replace(lay, precision=p), check_memory=False).prediction.step_components["compute"]
        for p in ("bf16", "mxfp8")
    }
    assert t["mxfp8"] < t["bf16"] * 0.75  # the GEMMs at twice the peak; attention and memory-bound work are not
    rejected = evaluate(m, h100, replace(stage, gpus_per_node=8), replace(lay, precision="mxfp8"), check_memory=False)
    assert isinstance(rejected, Rejected) and "mcore.precision_on_hardware" in rejected.rule_ids


def test_ep_overlap_hides_its_measured_share_of_the_all_to_all_and_tp_costs_collectives(monkeypatch):
    """With --overlap-moe-expert-parallel-comm, steptime.EP_OVERLAP_HIDDEN of the all-to-all runs under the compute
    (NVIDIA's Nsight comparison), never more than the compute; the dropless host wait stays exposed (measured here
    without it: steptime.MOE_HOST_WAIT_S at 0)."""
    for d in list(steptime.MOE_HOST_WAIT_S):
        monkeypatch.setitem(steptime.MOE_HOST_WAIT_S, d, 0.0)
    monkeypatch.setattr(planner, "_TABLES", type(planner._TABLES)())  # no step a test before kept with the wait
    m, hw = model("dsv3"), hardware("h100")
    stage = _stage(gpus=1024, global_batch=8192)
    lay = Layout(tp=2, ep=64, recompute=("mla_up_proj", "mlp"))  # one PP rank: its a2a and compute are the step's
    plain = evaluate(m, hw, stage, lay, check_memory=False).prediction.step_components
    recipe = replace(A.DEFAULT_RECIPE, overlap_moe_expert_parallel_comm=True)
    over = evaluate(m, hw, stage, lay, check_memory=False, recipe=recipe).prediction.step_components
    hidden = min(plain["compute"], steptime.EP_OVERLAP_HIDDEN * plain["a2a"])
    assert 0 < hidden < plain["a2a"]
    assert over["a2a"] == pytest.approx(plain["a2a"] - hidden, rel=1e-6)
    assert over["compute"] == plain["compute"] and plain["tp_comm"] > 0
    tp1 = evaluate(m, hw, stage, replace(lay, tp=1), check_memory=False).prediction.step_components
    assert tp1["tp_comm"] == 0


@pytest.mark.megatron
@pytest.mark.parametrize(
    ("name", "system"), [("dsv3", "gb200"), ("qwen3_235b_a22b", "b300"), ("gpt_oss_120b", "gb300")]
)
@pytest.mark.long
def test_plan_argv_0_of_a_new_model_is_training_ready(name, system):
    """`plan +stage=1k model=NAME hardware=SYSTEM --argv 0` (the CLI) prints the GPT path's flags for the planner's
    best layout, and megatron-core 0.19.2 parses, validates and builds its optimizer from them (as a Blackwell part).
    FP32 optimizer state declared: Megatron builds the precision-aware optimizer only from Transformer Engine's
    FusedAdam, which a CPU machine lacks (the BF16 path: test_the_precision_aware_optimizer_is_emitted_...)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "plan",
            "+stage=1k",
            f"model={name}",
            f"hardware={system}",
            "workload.recipe.optim=[fp32]",
            "--argv",
            "0",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    argv = [t.strip("'") for t in out.stdout.replace("\\\n", " ").split()]
    assert "--hybrid-layer-pattern" not in argv and "--num-experts" in argv
    assert MC.check_candidate(argv, 1024, arch=10) is None


@pytest.mark.long
@pytest.mark.megatron
def test_the_precision_aware_optimizer_is_emitted_counted_and_built_as_megatron_builds_it():
    """Megatron-Bridge's DeepSeek-V3 recipe (recipes/deepseek/deepseek_v3.py:161-165 at c0b9a0003) trains with
    --use-precision-aware-optimizer, BF16 main grads and BF16 moments: the argv carries the flags, megatron-core
    0.19.2 parses it (grads not accumulated in FP32) and builds it where Transformer Engine is, and the memory model
    counts 2 B of grads and 4 + 2 + 2 B of state per parameter (12 B and 4 B without), the grad sync half the bytes."""
    import torch

    from orchestrator.plan import memory

    m, hw = model("dsv3"), hardware("h100")
    stage = _stage(gpus=1024, global_batch=8192)
    lay = Layout(tp=2, pp=8, vpp=4, ep=64, recompute=("mla_up_proj", "mlp"))
    assert memory.optimizer_bytes(m, stage, "bf16") == (2, 8)
    assert memory.optimizer_bytes(m, stage, "bf16_moments") == (4, 8)
    assert memory.optimizer_bytes(m, stage) == (memory.GRAD_BYTES, memory.ADAM_BYTES)
    assert not memory.precision_aware(m, replace(stage, use_distributed_optimizer=False), "bf16")
    fp32, pa = (evaluate(m, hw, stage, replace(lay, optim=o), check_memory=False) for o in ("fp32", "bf16"))
    assert isinstance(fp32, Planned) and isinstance(pa, Planned)
    assert pa.prediction.memory_gb < fp32.prediction.memory_gb - 5  # the 1,024-H100 anchor row's heaviest rank
    g32, g16 = (p.prediction.step_components["grad_sync"] for p in (fp32, pa))
    assert g16 == pytest.approx(g32 * (2 + 2) / (4 + 2), rel=1e-6)  # BF16 reduce-scatter, BF16 param all-gather
    argv = A.megatron_argv(m, stage, pa.layout, layer_pattern=pa.prediction.layer_pattern, train_iters=10)
    flags = A.parse_flags(argv)
    assert flags["use_precision_aware_optimizer"] and flags["main_grads_dtype"] == flags["exp_avg_dtype"] == "bf16"
    assert flags["main_params_dtype"] == "fp32" and flags["exp_avg_sq_dtype"] == "bf16"
    assert "--use-precision-aware-optimizer" not in A.megatron_argv(
        m, stage, fp32.layout, layer_pattern=pa.prediction.layer_pattern, train_iters=10
    )
    MC.import_megatron()
    args = MC.validated_args(MC.for_parser(argv)[0], stage.gpus)
    assert not args.accumulate_allreduce_grads_in_fp32 and args.main_grads_dtype == torch.bfloat16
    try:  # Megatron builds this optimizer from Transformer Engine's FusedAdam only (optimizer_config.py:445-468)
        import transformer_engine  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="requires FusedAdam from TransformerEngine"):
            MC.training_setup(args, transformer_config=False)
    else:
        config = MC.training_setup(args, transformer_config=False)
        assert config.use_precision_aware_optimizer and config.exp_avg_sq_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="optimizer precision 'fp8'"):
        memory.optimizer_bytes(m, stage, "fp8")


def test_every_microbatch_adds_its_weight_gradients_into_the_main_grads():
    """Each microbatch's weight-gradient GEMMs add into the main grads (Megatron's gradient-accumulation fusion:
    TE's GroupedLinear with accumulate_into_main_grad, megatron/core/transformer/moe/experts.py:525, :631): a read
    and a write of every local parameter's main grad, FP32 unless the precision-aware optimizer's BF16. With all
    128 experts of Qwen3-235B on every GPU (EP1) that traffic outlasts the experts' wgrad GEMMs and the compute
    grows, less with BF16 main grads; at EP32 the same traffic per GPU is 32x smaller and hides under them."""
    m, hw = model("qwen3_235b_a22b"), hardware("gb300")
    stage = _stage(gpus=256, global_batch=8192, gpus_per_node=4)

    def compute(lay: Layout, optim: str) -> float:
        lay = replace(lay, optim=optim, precision="mxfp8")
        return evaluate(m, hw, stage, lay, check_memory=False).prediction.step_components["compute"]

    ep1, ep32 = Layout(tp=2, pp=8, vpp=2, ep=1, mbs=2), Layout(pp=4, ep=32, mbs=2)
    saved = compute(ep1, "fp32") - compute(ep1, "bf16")
    # m = 256 microbatches, at most 12 of the 94 layers on a PP8 rank, 2 B less read and written per routed param
    routed_layer = m.num_experts * 3 * m.hidden_size * m.moe_ffn_hidden_size
    most = 256 * 12 * routed_layer * 4 / (hw.hbm_gb_s * 1e9)
    assert most / 2 < saved <= most * (1 + 1e-12)  # equal to the bound where every routed param is local
    assert compute(ep32, "fp32") == compute(ep32, "bf16")


def test_the_expert_output_is_written_but_not_kept():
    """Megatron applies the routing probabilities in the experts' activation and unpermutes without them, so no op
    saves the fc2 output (memory.NOT_SAVED): the memory model keeps the expert input, fc1 output and activation
    only, while the step's memory-bound passes (block_activation_elems) still count the fc2 output."""
    from orchestrator.plan import memory

    m = model("qwen3_30b_a3b")
    t = memory.block_activation_elems(m, 0, True)
    assert "expert_fc2" in t and "expert_fc2" in memory.NOT_SAVED
    assert memory._kept(t, (), ())[1] == t["moe_input"] + t["expert_fc1"] + t["moe_act"]


def test_the_output_head_runs_at_the_bf16_peak_in_an_fp8_stage():
    """The LM head is no FP8 module (a plain ColumnParallelLinear): a bigger vocabulary costs the same compute in an
    MXFP8 stage as in a BF16 one."""
    m = model("qwen3_30b_a3b")
    hw = hardware("gb200")
    stage = _stage(gpus=8, global_batch=512, gpus_per_node=hw.gpus_per_node)
    lay = Layout(ep=8, mbs=4, dispatcher="flex", flex_backend="hybridep")

    def compute(vocab: int, precision: str) -> float:
        p = evaluate(replace(m, vocab_size=vocab), hw, stage, replace(lay, precision=precision), check_memory=False)
        assert isinstance(p, Planned)
        return p.prediction.step_components["compute"]

    grow = {p: compute(2 * m.vocab_size, p) - compute(m.vocab_size, p) for p in ("bf16", "mxfp8")}
    assert grow["bf16"] > 0 and grow["mxfp8"] == pytest.approx(grow["bf16"], rel=1e-9)


@pytest.mark.long
@pytest.mark.megatron
def test_a_bf16_grad_buffer_is_emitted_counted_and_parsed_as_megatron_parses_it():
    """The recipe's --grad-reduce-in-bf16 (Megatron-Bridge's ddp.grad_reduce_in_fp32 = False): megatron-core 0.19.2
    then keeps grads out of FP32 accumulation with FP32 main grads, and the memory model counts 2 B of grad buffer
    per parameter (4 B without); the optimizer state is unchanged."""
    import torch

    from orchestrator.plan import memory

    m, hw = model("qwen3_235b_a22b"), hardware("h100")
    stage = _stage(gpus=256, global_batch=2048)
    lay = Layout(tp=2, pp=8, vpp=4, ep=32)
    on = replace(A.DEFAULT_RECIPE, grad_reduce_in_bf16=True)
    assert memory.optimizer_bytes(m, stage, "fp32", True) == (2, memory.ADAM_BYTES)
    assert memory.optimizer_bytes(m, stage, "bf16", True) == (2, 8)
    base, bf16 = (evaluate(m, hw, stage, lay, check_memory=False, recipe=r) for r in (A.DEFAULT_RECIPE, on))
    assert isinstance(base, Planned) and isinstance(bf16, Planned)
    assert bf16.prediction.memory_gb < base.prediction.memory_gb - 1
    argv = A.megatron_argv(m, stage, lay, recipe=on, layer_pattern=bf16.prediction.layer_pattern, train_iters=10)
    assert "--grad-reduce-in-bf16" in argv
    assert "--grad-reduce-in-bf16" not in A.megatron_argv(
        m, stage, lay, layer_pattern=bf16.prediction.layer_pattern, train_iters=10
    )
    MC.import_megatron()
    args = MC.validated_args(MC.for_parser(argv)[0], stage.gpus)
    assert not args.accumulate_allreduce_grads_in_fp32 and args.main_grads_dtype == torch.float32
