"""orchestrator.plan.argv: the flags are Megatron's own (checked by megatron-core 0.19.2's real parser and
validate_args), dev-only flags are named as such, the layout reads back, and the guide's configs A/B/C
match golden files (UPDATE_GOLDEN=1 rewrites them)."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.core.decision import Decision
from orchestrator.core.knobs import OPTIM_DTYPES
from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig
from orchestrator.plan import argv as A
from orchestrator.plan import flags as F
from orchestrator.plan import ranks
from orchestrator.plan.layout import Layout, groups
from tests.megatron_env import as_hopper, import_megatron

GOLDEN = Path(__file__).parent.parent / "golden"
MODEL = ModelConfig()
STAGE_1K = StageConfig(name="1k", gpus=1024, warmup_iters=300, measure_iters=50)
STAGE_8K = StageConfig(name="8k", gpus=8192, warmup_iters=300, measure_iters=50, promotes_from="1k")
NEVER = {
    "--pipeline-model-parallel-layout",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--moe-enable-deepep",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
}
RATIO_SYMBOL = {128: "H", 4: "C", 0: "W"}


def pattern_for(model: ModelConfig, segments: int) -> str:
    """The planner's pattern (orchestrator.plan.pipeline) when it is there, else an even split."""
    try:
        from orchestrator.plan import pipeline

        return pipeline.layer_pattern(model, pipeline.split_blocks(model.num_layers, segments))
    except ImportError:  # pragma: no cover - fallback until the pipeline module lands
        n = model.num_layers
        blocks = [RATIO_SYMBOL[r] + "E" for r in model.csa_compress_ratios[:n]]
        cuts = [n * i // segments for i in range(segments + 1)]
        main = "|".join("".join(blocks[cuts[i] : cuts[i + 1]]) for i in range(segments))
        return main + ("/" + RATIO_SYMBOL[model.csa_compress_ratios[n]] + "E") * model.mtp_num_layers


def build(layout: Layout, stage: StageConfig = STAGE_1K, model: ModelConfig = MODEL) -> list:
    return A.megatron_argv(
        model,
        stage,
        layout,
        layer_pattern=pattern_for(model, layout.pp * layout.vpp),
        train_iters=stage.warmup_iters + stage.measure_iters,
    )


CONFIGS = {  # the guide's table: TP1 PP8 EP64 ETP1 b=1, B=4096, S=8192
    "A": (Layout(tp=1, pp=8, cp=1, ep=64, etp=1, mbs=1), STAGE_1K),
    "B": (Layout(tp=1, pp=8, cp=1, ep=64, etp=1, mbs=1), STAGE_8K),
    "C": (Layout(tp=1, pp=8, cp=4, ep=64, etp=1, mbs=1), STAGE_8K),
}


# --- Megatron's own parser -------------------------------------------------------------------


@pytest.fixture(scope="module")
def megatron_args():
    import_megatron()
    from megatron.training import arguments

    return arguments


def main_argv(argv: list) -> tuple:
    """Strip dev-only flags and map the dev pattern symbols C/H/W to main's DSA symbol D (same layer
    count and '|' segments), so main's parser sees everything else unchanged."""
    keep, dropped = F.split_dev(argv)
    i = keep.index("--hybrid-layer-pattern")
    keep[i + 1] = keep[i + 1].translate(str.maketrans({s: "D" for s in F.DEV_PATTERN_SYMBOLS}))
    return keep, dropped


def megatron_parse(arguments, argv: list):
    """parse_args alone, as pretrain_hybrid.py would see `argv` (parse only: TE-version checks need a GPU)."""
    saved = sys.argv
    sys.argv = ["pretrain_hybrid.py", *argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return arguments.parse_args()
    finally:
        sys.argv = saved


def megatron_validate(arguments, argv: list, world: int, rank: int = 0):
    """parse_args + validate_args exactly as pretrain does, with WORLD_SIZE = N (and RANK), on a pretend H100."""
    saved = (sys.argv, os.environ.get("WORLD_SIZE"), os.environ.get("RANK"))
    sys.argv = ["pretrain_hybrid.py", *argv]
    os.environ["WORLD_SIZE"], os.environ["RANK"] = str(world), str(rank)
    try:
        with contextlib.redirect_stdout(io.StringIO()), as_hopper():
            args = arguments.parse_args()
            arguments.validate_args(args)
        return args
    finally:
        sys.argv = saved[0]
        for key, val in (("WORLD_SIZE", saved[1]), ("RANK", saved[2])):
            if val is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = val


def check_with_megatron(arguments, layout: Layout, stage: StageConfig, argv: list):
    keep, dropped = main_argv(argv)
    assert set(dropped) <= F.DEV_ONLY_FLAGS
    args = megatron_validate(arguments, keep, stage.gpus)
    g = groups(layout, stage.gpus, stage.global_batch)
    assert args.tensor_model_parallel_size == layout.tp
    assert args.pipeline_model_parallel_size == layout.pp
    assert args.context_parallel_size == layout.cp
    assert args.expert_model_parallel_size == layout.ep
    assert args.expert_tensor_parallel_size == layout.etp
    assert args.data_parallel_size == g.d_a  # Megatron's DP is the guide's D_a
    assert args.virtual_pipeline_model_parallel_size == (layout.vpp if layout.vpp > 1 else None)
    assert args.num_layers == A.pattern_layers(argv[argv.index("--hybrid-layer-pattern") + 1])
    assert args.global_batch_size // (args.micro_batch_size * args.data_parallel_size) == g.m
    assert args.sequence_parallel == (layout.tp > 1)
    # the optimizer precision: Megatron's own dtypes after validate_args (dev A:1147-1150 maps the names)
    torch_name = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}
    assert bool(args.use_precision_aware_optimizer) == (layout.optim != "fp32")
    dtypes = (args.main_grads_dtype, args.main_params_dtype, args.exp_avg_dtype, args.exp_avg_sq_dtype)
    assert tuple(str(d) for d in dtypes) == tuple(torch_name[n] for n in OPTIM_DTYPES[layout.optim])
    return args


@pytest.mark.long
def test_flag_branches_match_megatron_parser(megatron_args):
    """A 'main' flag is one 0.19.2's parser knows; every flag it does not know is in DEV_ONLY_FLAGS."""
    parser = megatron_args.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    known = {opt for action in parser._actions for opt in action.option_strings}
    main = {f for f, (branch, _) in F.FLAGS.items() if branch == F.MAIN}
    assert main <= known, sorted(main - known)
    assert set(F.FLAGS) - known <= F.DEV_ONLY_FLAGS
    assert F.DEV_ONLY_FLAGS & known == F.DEV_VALUE_FLAGS  # known flag, dev-only value
    assert known >= NEVER  # the flags we never emit are real Megatron flags


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_guide_configs_pass_megatron_validation(megatron_args, name):
    layout, stage = CONFIGS[name]
    args = check_with_megatron(megatron_args, layout, stage, build(layout, stage))
    expected_d_a, expected_m = {"A": (128, 32), "B": (1024, 4), "C": (256, 16)}[name]
    assert (args.data_parallel_size, args.global_batch_size // args.data_parallel_size) == (expected_d_a, expected_m)


PROBED = {  # a rank probe of the guide's configs, and of a flex (DeepEP) layout with VPP
    **CONFIGS,
    "flex": (Layout(tp=1, pp=4, vpp=2, cp=1, ep=64, etp=1, mbs=1, dispatcher="flex", flex_backend="deepep"), STAGE_1K),
}


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(PROBED))
def test_rank_probe_argv_passes_megatron_validation(megatron_args, name):
    """A one-GPU rank probe runs the layout's own flags plus --fake-process-group (dev
    megatron/training/arguments.py:4312; initialize.py:343-350 opens backend 'fake' over torch's FakeStore)
    with RANK = the probed rank and WORLD_SIZE = N: Megatron's parser and validate_args accept it for every
    bounding rank, keep the layout's parallel sizes, and turn off the NaN check and the gloo groups
    (dev arguments.py:1932-1941, the same in 0.19.2). dev refuses the flex dispatcher with a fake process
    group (arguments.py:1933-1935), so a flex layout is probed with alltoall."""
    layout, stage = PROBED[name]
    argv = A.probe_argv(build(layout, stage))
    assert argv[-1] == A.PROBE_FLAG and argv.count(A.PROBE_FLAG) == 1
    keep, dropped = main_argv(argv)
    assert set(dropped) <= F.DEV_ONLY_FLAGS
    bound = ranks.probe_ranks(layout, stage.gpus, layout.pp // 2)
    assert bound[0] == 0 and bound[-1] == stage.gpus - 1 and len(bound) == len(set(bound)) <= 3
    for rank in bound:
        args = megatron_validate(megatron_args, keep, stage.gpus, rank)
        assert args.fake_process_group and (args.rank, args.world_size) == (rank, stage.gpus)
        assert not args.check_for_nan_in_loss_and_grad and not args.use_gloo_process_groups
        assert (args.pipeline_model_parallel_size, args.expert_model_parallel_size) == (layout.pp, layout.ep)
        assert args.moe_token_dispatcher_type == ("alltoall" if layout.dispatcher == "flex" else layout.dispatcher)
        # the last rank prints the iteration line (its peak is in its sidecar); the others are DP-rank 0,
        # the ranks Megatron's report_memory prints the memory line on (dev common_utils.py:311-317)
        assert rank == stage.gpus - 1 or ranks.coords(layout, stage.gpus, rank)["dp"] == 0
    # the probe is the layout apart from the flag (and a flex dispatcher's): the same model, batch and recipe
    plain = set(build(layout, stage)) - {"flex", "deepep", "--moe-flex-dispatcher-backend"}
    assert plain <= set(argv) | {"alltoall"}


@st.composite
def legal_layouts(draw):
    """Layouts Megatron's validate_args must accept for DSv4-Pro on 1024 / 8192 GPUs."""
    stage = draw(st.sampled_from([STAGE_1K, STAGE_8K]))
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    vpp = draw(st.sampled_from([1, 2, 3]) if pp > 1 else st.just(1))
    assume(pp * vpp <= MODEL.num_layers)
    cp = draw(st.sampled_from([1, 2, 4, 8]))
    ep = draw(st.sampled_from([8, 16, 32, 64, 96, 128, 192, 384]))
    etp = draw(st.sampled_from([1, 2]))
    mbs = draw(st.sampled_from([1, 2]))
    per_stage = stage.gpus // pp
    assume(per_stage % (tp * cp) == 0 and per_stage % (etp * ep) == 0)
    assume(stage.global_batch % (mbs * per_stage // (tp * cp)) == 0)
    recompute = draw(st.sampled_from([(), ("full",), ("mla_up_proj", "mhc"), ("moe_act",), ("mla_up_proj", "moe_act")]))
    offload = draw(st.sampled_from([(), ("expert_fc1",), ("core_attn", "attn_proj"), ("moe_act",)]))
    assume(not (recompute == ("full",) and offload))
    disp = draw(st.sampled_from(["alltoall", "allgather", "flex:deepep", "flex:hybridep"]))
    dispatcher, _, backend = disp.partition(":")
    cf = draw(st.sampled_from([None, 1.0, 1.5]))
    mapping = draw(st.booleans())
    optim = draw(st.sampled_from(["fp32", "bf16", "bf16_moments"]))
    assume(not (mapping and pp > 1 and per_stage // (etp * ep) != per_stage // (tp * cp)))  # PS:898
    layout = Layout(
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        ep=ep,
        etp=etp,
        mbs=mbs,
        recompute=recompute,
        offload=offload,
        dispatcher=dispatcher,
        flex_backend=backend or None,
        capacity_factor=cf,
        use_tp_pp_dp_mapping=mapping,
        optim=optim,
    )
    return layout, stage


@pytest.mark.long
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(legal_layouts())
def test_many_candidates_pass_megatron_validation(megatron_args, case):
    layout, stage = case
    check_with_megatron(megatron_args, layout, stage, build(layout, stage))


@pytest.mark.parametrize(
    "changes",
    [
        {"precision": "fp8"},
        {"precision": "fp8_cs"},
        {"precision": "mxfp8"},
        {"transformer_engine": False},
        {"deterministic_mode": True},
        {"attention_backend": "flash"},
        {"packed_sequences": False},
        {"cp_partition_mode": "contiguous"},
    ],
)
@pytest.mark.long
def test_stage_variants_parse_in_megatron(megatron_args, changes):
    """Stage knobs and the layout's compute precision map to flags/values main's parser accepts (parse only:
    TE-version checks need a GPU)."""
    import dataclasses

    changes = dict(changes)
    layout = Layout(tp=2, pp=4, cp=2, ep=32, mbs=1, precision=changes.pop("precision", "bf16"))
    stage = dataclasses.replace(STAGE_1K, **changes)
    keep, _ = main_argv(build(layout, stage))
    args = megatron_parse(megatron_args, keep)
    assert args.fp8 == (None if layout.precision == "bf16" else "e4m3")
    assert layout.precision == "bf16" or args.fp8_recipe == A.FP8_RECIPES[layout.precision]
    assert args.transformer_impl == ("transformer_engine" if stage.transformer_engine else "local")
    assert args.deterministic_mode == stage.deterministic_mode
    assert str(args.attention_backend).endswith("fused" if stage.attention_backend == "cudnn" else "flash")
    assert args.calculate_per_token_loss == stage.packed_sequences
    assert args.cp_comm_type == ["p2p"] and args.bf16


@pytest.mark.long
def test_megatron_rejects_broken_argv(megatron_args):
    """The check can fail: Megatron's parser rejects an unknown flag and validate_args a bad config."""
    layout, stage = CONFIGS["A"]
    keep, _ = main_argv(build(layout, stage))
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        megatron_validate(megatron_args, keep + ["--moe-enable-deepepp"], stage.gpus)
    experts = keep.index("--num-experts")
    bad = keep[: experts + 1] + ["383"] + keep[experts + 2 :]  # 383 % EP64 != 0
    with pytest.raises(AssertionError):
        megatron_validate(megatron_args, bad, stage.gpus)
    with pytest.raises(AssertionError):  # world not divisible by TP x PP x CP
        megatron_validate(megatron_args, keep, 1000)
    # Dev-only flags are what main's parser does not know: passing them through fails.
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        megatron_validate(megatron_args, keep + ["--moe-n-hash-layers", "3"], stage.gpus)


# --- pure properties (no Megatron) -----------------------------------------------------------


@pytest.mark.long
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(legal_layouts())
def test_round_trip_and_flag_rules(case):
    layout, stage = case
    argv = build(layout, stage)
    assert A.layout_from_argv(argv) == layout
    flags = [t for t in argv if t.startswith("--")]
    assert set(flags) <= set(F.FLAGS)
    assert not NEVER & set(flags)
    assert ("--sequence-parallel" in flags) == (layout.tp > 1)
    assert ("--moe-flex-dispatcher-backend" in flags) == (layout.dispatcher == "flex")
    assert ("--cp-partition-mode" in flags) == (layout.cp > 1)
    assert len(flags) == len(set(flags))
    f = A.parse_flags(argv)
    assert f["train_iters"] == stage.warmup_iters + stage.measure_iters
    assert f["log_memory_interval"] % f["log_interval"] == 0
    assert f["seq_length"] % (2 * layout.cp) == 0


def test_parse_flags_types_and_extra_wins():
    layout, stage = CONFIGS["C"]
    argv = build(layout, stage) + [
        "--train-iters",
        "7",
        "--not-ours",
        "x",
        "--moe-router-force-load-balancing",
        "--exit-interval=9",
        "--lr=1e-4",
        "--many",
        "a",
        "b",
    ]
    f = A.parse_flags(argv)
    assert f["context_parallel_size"] == 4 and f["train_iters"] == 7
    assert f["not_ours"] == "x" and f["moe_router_force_load_balancing"] is True
    assert f["exit_interval"] == "9" and f["many"] == ["a", "b"]
    assert f["lr"] == 1e-4  # a recipe flag: typed, and the later one wins
    assert f["max_seqlen_per_dp_cp_rank"] == 8192 // 4
    assert f["mock_data"] is True and f["use_tp_pp_dp_mapping"] is False
    assert f["cp_comm_type"] == ["p2p"]


def test_argv_refuses_inconsistent_input():
    with pytest.raises(ValueError, match="segments"):
        A.megatron_argv(MODEL, STAGE_1K, Layout(pp=8, vpp=2, ep=64), layer_pattern=pattern_for(MODEL, 8), train_iters=1)
    with pytest.raises(ValueError, match="flex_backend"):
        build(Layout(pp=8, ep=64, dispatcher="flex"))
    with pytest.raises(ValueError, match="full"):
        build(Layout(pp=8, ep=64, recompute=("full", "moe_act")))


def test_dev_only_set_is_the_v4_path():
    """These exist only on Megatron's dev branch (the DeepSeek-V4 path): megatron-core 0.19.2's parser does not
    know them (test_flag_branches_match_megatron_parser), dev's does (megatron/training/arguments.py and the
    TransformerConfig fields of megatron/core/transformer/transformer_config.py at d48bd6be0a85)."""
    for flag in (
        "--experimental-attention-variant",
        "--csa-window-size",
        "--csa-compress-ratios",
        "--enable-hyper-connections",
        "--num-residual-streams",
        "--use-fused-mhc",
        "--moe-n-hash-layers",
        "--cp-partition-mode",
        "--o-groups",
        "--o-lora-rank",
    ):
        assert F.branch_of(flag) == F.DEV and flag in F.DEV_ONLY_FLAGS
    assert F.branch_of("--expert-model-parallel-size") == F.MAIN


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hash_layers_are_the_first_moe_blocks(name):
    """On the hybrid path every pattern symbol is a layer numbered i + 1 + offset, the offset counting the
    earlier segments' symbols (megatron/core/models/hybrid/hybrid_block.py:617-618, hybrid_layer_allocation.py:
    486 at dev d48bd6be0a85), and the router hash-routes layer_number <= moe_n_hash_layers (megatron/core/
    transformer/moe/router.py:202-206). The flag must therefore be 6 on 'HEHECE...' for the model's 3 blocks."""
    layout, stage = CONFIGS[name]
    f = A.parse_flags(build(layout, stage))
    segments = f["hybrid_layer_pattern"].split("/")[0].split("|")
    hashed, moe, offset = [], [], 0
    for seg in segments:  # Megatron's numbering, segment by segment
        for i, sym in enumerate(seg):
            number = i + 1 + offset
            if sym == "E":
                moe.append(number)
                if number <= f["moe_n_hash_layers"]:
                    hashed.append(number)
        offset += len(seg)
    assert hashed == moe[: MODEL.moe_n_hash_layers] == [2, 4, 6] and f["moe_n_hash_layers"] == 6
    assert A.parse_flags(build(layout, stage, replace(MODEL, moe_n_hash_layers=0)))["moe_n_hash_layers"] is None


def test_ncclep_carries_its_rank_capacity_factor():
    """Dev's ncclep dispatcher refuses to start without --moe-expert-rank-capacity-factor (it sizes the receive
    buffer: megatron/core/transformer/moe/token_dispatcher.py:1717-1722 at d48bd6be0a85); nothing else gets it."""
    for backend in ("ncclep", "hybridep", "deepep"):
        f = A.parse_flags(build(Layout(pp=8, ep=64, dispatcher="flex", flex_backend=backend), STAGE_8K))
        assert f["moe_expert_rank_capacity_factor"] == (1.5 if backend == "ncclep" else None), backend


def test_hash_rule_rejects_a_block_count():
    """The old argv wrote the block count (3): only the first MoE layer was hash-routed. The rule sees it."""
    from orchestrator.plan import rules as R

    layout, stage = CONFIGS["A"]
    argv = build(layout, stage)
    i = argv.index("--moe-n-hash-layers")
    ctx = R.Ctx(MODEL, stage, HardwareConfig(), layout, MODEL.num_layers, argv=tuple(argv))
    assert not R.BY_ID["mcore.hash_layers_are_layer_numbers"].violated(ctx)
    ctx.argv = tuple(argv[: i + 1] + ["3"] + argv[i + 2 :])
    assert R.BY_ID["mcore.hash_layers_are_layer_numbers"].violated(ctx)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_golden_argv(name):
    layout, stage = CONFIGS[name]
    text = A.shell_join(build(layout, stage), multiline=True) + "\n"
    path = GOLDEN / f"argv_{name}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path} differs; UPDATE_GOLDEN=1 rewrites it after review"


def test_golden_files_parse_back():
    """The golden text is a real shell line whose layout is the guide's."""
    import shlex

    for name, (layout, stage) in CONFIGS.items():
        argv = shlex.split((GOLDEN / f"argv_{name}.txt").read_text().replace("\\\n", " "))
        assert A.layout_from_argv(argv) == layout
        g = groups(layout, stage.gpus, stage.global_batch)
        assert math.prod([layout.tp, layout.cp, g.d_a]) == stage.gpus // layout.pp


def dev_compress_ratios_check(pattern: str, provided: list[int]) -> None:
    """Dev's rule for --csa-compress-ratios under dsv4_hybrid (megatron/training/argument_utils.py:306-365 at
    dev d48bd6be, the assertion the H200 device run hit): W/C/H symbols have fixed ratios 0/4/128; the list
    has one entry per such symbol of the whole pattern (MTP included), or one per symbol with 0 on the rest."""
    fixed = {"W": 0, "C": 4, "H": 128}
    layers = "".join(s.replace("|", "") for s in pattern.split("/"))
    attn = [fixed[ch] for ch in layers if ch in fixed]
    if len(provided) == len(attn):
        assert provided == attn, f"ratios {provided} do not match the pattern's symbols {attn}"
    elif len(provided) == len(layers):
        assert provided == [fixed.get(ch, 0) for ch in layers], "padded ratios must be 0 on non-attention symbols"
    else:
        raise AssertionError(f"{len(provided)} ratios for {len(attn)} attention symbols of {pattern!r}")


@pytest.mark.parametrize("blocks", [None, 4, 7])
def test_compress_ratios_follow_the_pattern(blocks):
    """A stage that builds fewer blocks than the model (slice, gpu1) emits the pattern's ratios, not the
    model's per-block list: the list the device run's argv had for the 4-block tiny model failed dev."""
    from orchestrator.config import compose

    # gpu1 builds 4 blocks of the 9-block tiny model (stage.num_layers_override), 7: a cut pro model
    model = compose(["+stage=gpu1"]).cfg.model if blocks == 4 else MODEL
    if blocks is not None:
        model = replace(model, num_layers=blocks)
    pattern = pattern_for(model, 1)
    argv = build(Layout(tp=1, pp=1, vpp=1, cp=1, ep=8, etp=1, mbs=1), stage=STAGE_1K, model=model)
    given = argv[argv.index("--csa-compress-ratios") + 1]
    dev_compress_ratios_check(pattern, [int(x) for x in given.strip("[]").split(",")])
    if blocks == 4:
        # the model's own list has 10 entries: what the argv carried before, refused by dev
        with pytest.raises(AssertionError):
            dev_compress_ratios_check(pattern, list(model.csa_compress_ratios))


# --- one data path per stage ------------------------------------------------------------------


def flag_values(argv: list) -> dict:
    """flag -> the tokens after it (up to the next flag)."""
    out, flag = {}, None
    for tok in argv:
        if tok.startswith("--"):
            flag = tok
            out[flag] = ()
        elif flag is not None:
            out[flag] += (tok,)
    return out


def test_parity_reference_and_a_cp4_candidate_differ_only_in_layout_flags():
    """The correctness gate compares the same data: the CP1 reference (parity.reference) and a CP>1 candidate of
    the same stage, built as the sweep builds them (runspec.parity_spec), differ only in flags the knob
    registry says a layout decides; both read the packed THD varlen dataset with per-token loss."""
    from orchestrator import runspec
    from orchestrator.config import compose
    from orchestrator.core.knobs import LAYOUT_FLAGS
    from orchestrator.evidence.parity import data_differences
    from orchestrator.plan import planner
    from orchestrator.sweep.finalists import reference_layout

    cfg = compose(["+stage=8k", "workload=megatron"]).cfg
    res = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name)
    pairs = (
        (p, planner.evaluate(cfg.model, cfg.hardware, cfg.stage, reference_layout(cfg, p.layout), check_memory=False))
        for p in res.candidates
        if p.layout.cp > 1
    )
    cand, ref = next((p, r) for p, r in pairs if isinstance(r, planner.Planned))  # a reference Megatron can run
    assert ref.layout.cp == 1 and cand.layout.cp > 1
    a = runspec.parity_spec(cfg, cand, sweep="s", attempt=1, job_dir="/tmp/parity-a").argv
    b = runspec.parity_spec(cfg, ref, sweep="s", attempt=1, job_dir="/tmp/parity-b").argv
    assert data_differences(a, b) == {}
    fa, fb = flag_values(a), flag_values(b)
    differing = {f for f in set(fa) | set(fb) if fa.get(f) != fb.get(f)}
    assert "--context-parallel-size" in differing and differing <= LAYOUT_FLAGS, differing - LAYOUT_FLAGS
    for flag in ("--use-varlen-dataset", "--calculate-per-token-loss", "--sequence-packing-scheduler"):
        assert flag in a and flag in b, flag
    # the check is not vacuous: a data flag that differs is named
    assert "--use-varlen-dataset" in data_differences(a, [t for t in b if t != "--use-varlen-dataset"])


def test_every_layout_of_a_packed_stage_reads_the_same_data():
    """CP1 and CP4 of config B/C's stage emit the same data and loss flags; unpacked stages emit none."""
    data = ("--use-varlen-dataset", "--calculate-per-token-loss", "--varlen-mock-dataset-config-json")
    cp1, cp4 = build(*CONFIGS["B"]), build(*CONFIGS["C"])
    for flag in data:
        assert flag in cp1 and flag in cp4 and F.flag_value(cp1, flag) == F.flag_value(cp4, flag), flag
    assert F.flag_value(cp1, "--max-seqlen-per-dp-cp-rank") == "8192"  # S / CP
    assert F.flag_value(cp4, "--max-seqlen-per-dp-cp-rank") == "2048"
    unpacked = build(CONFIGS["A"][0], replace(STAGE_1K, packed_sequences=False, attention_backend="flash"))
    assert not set(data) & set(unpacked)


@pytest.mark.long
def test_offloading_layouts_carry_nvte_cpu_offload_v1_in_the_job_environment():
    """dev asserts NVTE_CPU_OFFLOAD_V1=1 with fine-grained offloading on TE >= 2.10 (megatron/training/
    arguments.py:2126-2133): every offloading candidate's JobSpec.env carries it, the others do not need it."""
    from orchestrator import runspec
    from orchestrator.config import compose
    from orchestrator.plan import planner

    assert A.megatron_env(Layout(offload=("expert_fc1",))) == {"NVTE_CPU_OFFLOAD_V1": "1"}
    assert A.megatron_env(Layout()) == {}
    cfg = compose(["+stage=16k", "workload=megatron"]).cfg
    res = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload="megatron")
    off = [p for p in res.candidates if p.layout.offload]
    assert off and len(off) < len(res.candidates)
    for p in off[:50] + [p for p in res.candidates if not p.layout.offload][:5]:
        env = runspec.build_spec(cfg, p, sweep="s", attempt=1, job_dir="/tmp/x").env
        assert (env.get("NVTE_CPU_OFFLOAD_V1") == "1") == bool(p.layout.offload), p.layout.short()


# --- a training run (best --flags --train) ------------------------------------------------------------


@pytest.mark.long
def test_a_training_run_keeps_the_layout_and_replaces_the_measurement(megatron_args):
    """The train argv is the measured layout's, on real data with a real tokenizer, its own length, save/load
    and evaluation: Megatron's parser and validate_args accept it and read those values back."""
    from orchestrator.core.schema import TrainConfig

    layout, stage = CONFIGS["A"]
    train = TrainConfig(data_path=["/data/a_text_document"], tokenizer_model="/tok", save="/ckpt", train_iters=1234)
    argv = A.megatron_argv(
        MODEL, stage, layout, layer_pattern=pattern_for(MODEL, layout.pp), train_iters=350, train=train
    )
    measured = build(layout, stage)
    assert "--mock-data" in measured and "--mock-data" not in argv and "NullTokenizer" not in argv
    assert A.layout_from_argv(argv) == A.layout_from_argv(measured) == layout
    args = check_with_megatron(megatron_args, layout, stage, argv)
    assert args.data_path == ["/data/a_text_document"] and args.tokenizer_type == "HuggingFaceTokenizer"
    assert args.tokenizer_model == "/tok" and (args.save, args.load) == ("/ckpt", "/ckpt")
    assert (args.train_iters, args.lr_decay_iters) == (1234, 1234)  # the decay follows the run, not the window
    assert (args.eval_iters, args.eval_interval, args.save_interval) == (10, 1000, 1000)
    assert not args.mock_data
    # the training schedule is TrainConfig's (DeepSeek-V3's), not the measurement's near-zero recipe LR
    assert (args.lr, args.min_lr, args.lr_warmup_init, args.lr_warmup_iters) == (2.2e-4, 2.2e-5, 0.0, 2000)
    assert args.lr_decay_style == "cosine" and args.seed == 1234 and args.tensorboard_dir == "/ckpt/tensorboard"
    assert (F.flag_value(measured, "--lr"), F.flag_value(measured, "--lr-warmup-iters")) == ("3.9e-06", "0")
    assert args.wandb_project is None and "--wandb-exp-name" not in argv  # W&B only with a project
    named = TrainConfig(save="/ckpt", wandb_project="dsv4", seed=7, lr=3e-4)
    argv = A.megatron_argv(
        MODEL, stage, layout, layer_pattern=pattern_for(MODEL, layout.pp), train_iters=1, train=named
    )
    args = check_with_megatron(megatron_args, layout, stage, argv)
    assert (args.wandb_project, args.wandb_exp_name) == ("dsv4", f"{MODEL.name}-{stage.name}")
    assert (args.seed, args.lr) == (7, 3e-4)


def test_the_training_schedule_says_where_each_value_came_from():
    """Each schedule value names its source: the schema's default with its publication, a setting of the
    train group, the performance recipe the run keeps."""
    from orchestrator.core.schema import TrainConfig

    rows = {name: (value, source) for name, value, source in A.train_schedule(TrainConfig(seed=7, save="/c"))}
    assert rows["lr"] == (2.2e-4, "default: DeepSeek-V3 Technical Report (arXiv:2412.19437) sec. 4.2")
    assert rows["lr_warmup_iters"][0] == 2000 and rows["lr_decay_iters"] == (500_000, "default: the run's train_iters")
    assert rows["seed"] == (7, "set: train.seed")
    assert rows["tensorboard_dir"][0] == "/c/tensorboard" and rows["wandb_project"][0] == "off"
    assert rows["clip_grad"] == (1.0, "performance recipe (workload.recipe)")


def test_unset_training_fields_are_placeholders_named():
    from orchestrator.core.schema import TrainConfig

    layout, stage = CONFIGS["A"]
    train = TrainConfig(save="/ckpt", load="/other")
    argv = A.megatron_argv(
        MODEL, stage, layout, layer_pattern=pattern_for(MODEL, layout.pp), train_iters=1, train=train
    )
    assert A.train_placeholders(train) == ["data_path", "tokenizer_model"]
    assert F.flag_value(argv, "--data-path") == "<train.data_path>"
    assert F.flag_value(argv, "--tokenizer-model") == "<train.tokenizer_model>"
    assert (F.flag_value(argv, "--save"), F.flag_value(argv, "--load")) == ("/ckpt", "/other")


@pytest.mark.long
def test_warm_start_argv_passes_megatron_validation(megatron_args, tmp_path):
    """stage.warm_start: the seed's launch saves its weights once, after its last iteration, without optimizer
    or RNG state; a later launch of another layout loads them as a fine-tune (iteration 0, no optimizer state)
    and stops if they are missing. Megatron's parser and validate_args accept both and read them as meant, in
    torch_dist, the format that loads under another parallel layout (docs/api-guide/core/dist_checkpointing.md)."""
    from orchestrator.core.paths import JobPaths
    from orchestrator.runspec import warm_start_flags

    seeder, later = CONFIGS["A"][0], Layout(tp=1, pp=4, cp=1, ep=32, etp=1, mbs=1)
    n = STAGE_1K.warmup_iters + STAGE_1K.measure_iters
    save = warm_start_flags(Decision.from_dict({"fidelity": "full", "seed_save": True}), tmp_path / "attempt-1", n)
    args = check_with_megatron(megatron_args, seeder, STAGE_1K, build(seeder) + save)
    seed = str(JobPaths(tmp_path / "attempt-1").seed_checkpoint)
    assert args.save == seed and args.save_interval == args.train_iters == n  # once, at the end of the window
    assert args.no_save_optim and args.no_save_rng and args.load is None and not args.finetune
    assert args.ckpt_format == "torch_dist"
    load = warm_start_flags(Decision.from_dict({"fidelity": "full", "warm_from": seed}), tmp_path / "attempt-2", 100)
    args = check_with_megatron(megatron_args, later, STAGE_1K, build(later) + load)
    assert args.load == seed and args.finetune and args.no_load_optim and args.no_load_rng
    assert args.exit_on_missing_checkpoint and args.save is None
    assert (
        warm_start_flags(Decision.from_dict({"fidelity": "screen"}), tmp_path, 60) == []
    )  # no seed asked for, none given


@pytest.mark.parametrize(
    "knobs",
    [
        {"offload": ("core_attn",), "precision": "fp8", "optim": "bf16"},
        {"offload": ("expert_fc1",), "precision": "mxfp8"},
    ],
)
@pytest.mark.long
def test_the_recipe_knobs_parse_in_megatron(megatron_args, knobs):
    """The flags of the 1k/8k stages' new knob values (core_attn / expert_fc1 offload, FP8 blockwise or MXFP8 compute,
    BF16 optimizer state) are ones dev's parser takes, with the values the layout says."""
    layout = Layout(tp=1, pp=8, ep=64, mbs=1, recompute=("mhc", "mla_up_proj"), **knobs)
    keep, _ = main_argv(build(layout, STAGE_1K))
    args = megatron_parse(megatron_args, keep)
    assert args.fine_grained_activation_offloading and list(args.offload_modules) == list(layout.offload)
    assert args.fp8 == "e4m3" and args.fp8_recipe == A.FP8_RECIPES[layout.precision]
    assert bool(args.use_precision_aware_optimizer) == (layout.optim != "fp32")
    assert A.layout_from_argv(keep) == layout
