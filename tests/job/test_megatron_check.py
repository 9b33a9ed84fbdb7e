"""The training-ready check (orchestrator/job/megatron_check.py): megatron-core 0.19.2's own parse_args +
validate_args, optimizer config and LR scheduler construction (megatron/training/training.py) accept every
generated argv and refuse one without --lr, on this CPU machine; the argv's recipe is what Megatron parses;
its optimizer state is what the memory model counts."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.core.decision import Decision
from orchestrator.core.schema import RecipeConfig
from orchestrator.job import megatron_check as MC
from orchestrator.plan import argv as A
from orchestrator.plan import memory
from tests.plan.test_argv import CONFIGS as GUIDE_CONFIGS
from tests.plan.test_argv import MODEL, build, pattern_for

ROOT = Path(__file__).resolve().parents[2]
RECIPE = RecipeConfig()
# The V4 recipe's BF16 optimizer state is built only from Transformer Engine's FusedAdam (megatron/core/optimizer/
# optimizer_config.py), which this CPU machine lacks: the whole training setup here runs each layout with FP32
# state (Megatron's default). The BF16 argv goes through validate_args in tests/plan/test_argv.py, whole on a node.
FP32_STATE = "workload.recipe.optim=[fp32]"
CONFIGS = {name: (replace(lay, optim="fp32"), stage) for name, (lay, stage) in GUIDE_CONFIGS.items()}


@pytest.fixture(scope="module")
def megatron():
    return MC.import_megatron()


def drop(argv: list[str], flag: str) -> list[str]:
    """argv without `flag` and its value."""
    i = argv.index(flag)
    return argv[:i] + argv[i + 2 :]


@pytest.mark.long
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_guide_configs_are_training_ready(megatron, name):
    layout, stage = CONFIGS[name]
    assert MC.check_candidate(build(layout, stage), stage.gpus) is None


@pytest.mark.long
def test_plan_argv_0_carries_the_recipe_and_megatron_accepts_it(megatron):
    """`plan +stage=1k --argv 0` (the CLI) has --lr and the overlap / fusion flags, and is training-ready."""
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "+stage=1k", FP32_STATE, "--argv", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    argv = out.stdout.replace("\\\n", " ").split()
    for flag in (
        "--lr",
        "--min-lr",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--moe-permute-fusion",
        "--moe-router-fusion",
        "--cross-entropy-loss-fusion",
        "--manual-gc",
        "--distributed-timeout-minutes",
    ):
        assert flag in argv, flag
    assert MC.check_candidate([t.strip("'") for t in argv], 1024) is None


def train_argv(name: str = "A", **changes) -> tuple[list[str], int]:
    """`best --flags --train`'s argv of guide config `name`: the layout on a training run (TrainConfig's
    schedule, seed and logging; data, tokenizer and checkpoints filled in)."""
    from orchestrator.core.schema import TrainConfig

    layout, stage = CONFIGS[name]
    train = TrainConfig(data_path=["/data/text_document"], tokenizer_model="/tok", save="/ckpt", **changes)
    argv = A.megatron_argv(
        MODEL, stage, layout, layer_pattern=pattern_for(MODEL, layout.pp), train_iters=1, train=train
    )
    return argv, stage.gpus


@pytest.mark.long
def test_the_training_run_is_training_ready_with_its_schedule(megatron):
    """The training run's argv (DeepSeek-V3's warm-up and cosine, a seed, TensorBoard and W&B) passes
    0.19.2's parse_args, validate_args and the LR scheduler's construction; a warm-up as long as the decay is
    refused by the scheduler, as `best` says before printing it."""
    argv, world = train_argv(wandb_project="dsv4")
    assert MC.check_candidate(argv, world) is None
    short, world = train_argv(train_iters=1000)  # 2000 warm-up iterations, a 1000-iteration decay
    assert "AssertionError" in (MC.check_candidate(short, world) or "")


@pytest.mark.long
def test_no_lr_fails_in_megatrons_scheduler(megatron):
    """--lr defaults to None (megatron/training/arguments.py:3892-3894 at dev d48bd6be0a85) and the scheduler
    does float(max_lr) (megatron/core/optimizer_param_scheduler.py:158; :148 in 0.19.2): setup dies."""
    layout, stage = CONFIGS["A"]
    msg = MC.check_candidate(drop(build(layout, stage), "--lr"), stage.gpus)
    assert msg is not None and msg.startswith("TypeError: float()")


@pytest.mark.long
def test_megatrons_own_messages_come_back(megatron):
    layout, stage = CONFIGS["A"]
    argv = build(layout, stage)
    assert "divisible" in (MC.check_candidate(argv, 1000) or "")  # validate_args: N = 1000 breaks the batch
    assert "unrecognized arguments: --bogus" in (MC.check_candidate([*argv, "--bogus"], stage.gpus) or "")
    plain = replace(stage, use_distributed_optimizer=False)  # param gather needs the distributed optimizer
    assert MC.check_candidate(build(layout, plain), stage.gpus) is None  # argv.overlaps drops it
    forced = [*build(layout, plain), "--overlap-param-gather"]
    assert "--overlap-param-gather only supported" in (MC.check_candidate(forced, stage.gpus) or "")


@pytest.mark.long
def test_megatron_parses_the_recipe_and_builds_the_optimizer_state_the_memory_model_counts(megatron):
    """Megatron's own optimizer config from the parsed args: Adam with FP32 master weights and FP32 moments
    (no precision-aware optimizer) = memory.ADAM_BYTES per parameter; FP32 main grads for bf16
    (megatron/training/arguments.py:1325-1327 at dev) = memory.GRAD_BYTES."""
    import torch

    layout, stage = CONFIGS["A"]
    layout = replace(layout, optim="fp32")  # FP32 state: the BF16 one needs TE's FusedAdam (tests/plan/test_argv.py)
    args = MC.validated_args(MC.for_parser(build(layout, stage))[0], stage.gpus)
    config = MC.training_setup(args, transformer_config=False)
    assert config.optimizer == "adam" and not config.use_precision_aware_optimizer
    dtypes = (config.main_params_dtype, config.exp_avg_dtype, config.exp_avg_sq_dtype)
    assert sum(torch.empty(0, dtype=d).element_size() for d in dtypes) == memory.ADAM_BYTES
    assert args.accumulate_allreduce_grads_in_fp32 and memory.GRAD_BYTES == 4
    assert (config.lr, config.min_lr, config.weight_decay, config.clip_grad) == (
        RECIPE.lr,
        RECIPE.min_lr,
        RECIPE.weight_decay,
        RECIPE.clip_grad,
    )
    assert (config.adam_beta1, config.adam_beta2, config.adam_eps) == (
        RECIPE.adam_beta1,
        RECIPE.adam_beta2,
        RECIPE.adam_eps,
    )
    assert args.lr_decay_style == RECIPE.lr_decay_style and args.lr_decay_iters == stage.warmup_iters + 50
    assert args.init_method_std == RECIPE.init_method_std
    assert args.moe_router_topk_scaling_factor == RECIPE.moe_router_topk_scaling_factor == 2.5
    assert args.activation_func_clamp_value == 10.0 and args.layernorm_epsilon == 1e-6  # --norm-epsilon
    assert args.rotary_scaling_factor == 4.0 and args.dsa_indexer_loss_coeff == 1e-2
    assert args.overlap_grad_reduce and args.overlap_param_gather
    assert args.moe_permute_fusion and args.moe_router_fusion and args.cross_entropy_loss_fusion
    assert args.manual_gc and args.manual_gc_interval == RECIPE.manual_gc_interval
    assert args.distributed_timeout_minutes == A.distributed_timeout_minutes(RECIPE, stage.gpus) == 64


@pytest.mark.long
def test_overlap_off_in_the_recipe_is_off_in_megatron(megatron):
    layout, stage = CONFIGS["C"]
    argv = A.megatron_argv(
        MODEL,
        stage,
        layout,
        layer_pattern=pattern_for(MODEL, layout.pp * layout.vpp),
        train_iters=10,
        recipe=RecipeConfig(overlap_grad_reduce=False),
    )
    assert MC.check_candidate(argv, stage.gpus) is None
    args = MC.validated_args(MC.for_parser(argv)[0], stage.gpus)
    assert not args.overlap_grad_reduce and not args.overlap_param_gather


# --- the Transformer Engine a node has, the environment a job gets ------------------------------------------


def offloading_argvs(every: bool = False) -> list[tuple[str, list[str], int, dict[str, str]]]:
    """(key, argv, N, env) of 16k's offloading candidates (the only stage that offloads), as the sweep builds
    them (runspec.build_spec: argv + JobSpec.env), the rule v4.full_recompute_hash_mhc lifted so that every
    candidate a fixed Megatron would run is among them: one per distinct (offload, recompute, CP, dispatcher,
    b), or `every` one."""
    from orchestrator import runspec
    from orchestrator.config import compose
    from orchestrator.plan import planner
    from orchestrator.plan import rules as R

    lifted = f"+stage.lifted_rules=[{R.FULL_RECOMPUTE_HASH_MHC}]"
    cfg = compose(["+stage=16k", "workload=megatron", lifted, FP32_STATE]).cfg
    out, seen = [], set()
    res = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload="megatron", recipe=cfg.workload.recipe)
    for p in res.candidates:
        lay = p.layout
        kind = (lay.offload, lay.recompute, lay.cp, lay.dispatcher, lay.mbs)
        if not lay.offload or (not every and kind in seen):
            continue
        seen.add(kind)
        spec = runspec.build_spec(cfg, p, sweep="s", attempt=1, job_dir="/tmp/offload")
        out.append((p.key, list(spec.argv), spec.n_gpus, dict(spec.env)))
    return out


@pytest.mark.long
def test_megatron_sees_the_node_te_version_and_asserts_the_offload_env(megatron):
    """Megatron's offload assertion (arguments.py:2126-2133 at dev; :1858 in 0.19.2) gates on the TE version it
    sees: with TE 2.13 assumed an offloading argv passes only in its job environment (NVTE_CPU_OFFLOAD_V1=1),
    with TE 2.9 the variable is not needed; no TE version given = the installed one (none here)."""
    _key, argv, world, env = offloading_argvs()[0]
    assert env["NVTE_CPU_OFFLOAD_V1"] == "1" and "--fine-grained-activation-offloading" in argv
    assert MC.check_candidate(argv, world, te_version=MC.NODE_TE, env=env) is None
    bare = {k: v for k, v in env.items() if k != "NVTE_CPU_OFFLOAD_V1"}
    refused = MC.check_candidate(argv, world, te_version=MC.NODE_TE, env=bare) or ""
    assert "NVTE_CPU_OFFLOAD_V1 should be set to 1" in refused
    assert MC.check_candidate(argv, world, te_version="2.9.0", env=bare) is None
    import os

    assert "NVTE_CPU_OFFLOAD_V1" not in os.environ  # the job's env was applied while Megatron read it, then undone


@pytest.mark.long
def test_dev_accepts_the_packed_data_at_cp1_and_every_kind_of_offloading_argv_with_te_2_13(tmp_path):
    """Megatron dev's own parse_args + validate_args + optimizer/scheduler setup (the exported dev tree first
    on sys.path, TE 2.13 assumed): the guide's A and B (CP1, now on the packed THD path) and C (CP4), and one
    offloading argv of every (offload, recompute, CP, dispatcher, b) the 16k stage plans, in its job env, and
    the warm start's seed save and load of it under another layout (stage.warm_start). The same argv
    without NVTE_CPU_OFFLOAD_V1 is refused by dev, naming it."""
    import json

    from orchestrator.runspec import warm_start_flags
    from tests.megatron_env import DEV, megatron_tree, run_in_tree

    GUIDE = CONFIGS

    cases = [
        {"key": f"guide-{n}", "argv": build(lay, st), "world": st.gpus, "env": {}, "te": MC.NODE_TE}
        for n, (lay, st) in GUIDE.items()
    ]
    offload = offloading_argvs()
    cases += [{"key": k, "argv": a, "world": w, "env": e, "te": MC.NODE_TE} for k, a, w, e in offload]
    _k, a, w, _e = offload[0]
    cases.append({"key": "no-env", "argv": a, "world": w, "env": {}, "te": MC.NODE_TE})
    # `best --flags --train`: the winner's layout on a training run (its LR schedule, seed, TensorBoard, W&B)
    for name in ("A", "C"):
        argv, world = train_argv(name, wandb_project="dsv4")
        cases.append({"key": f"train-{name}", "argv": argv, "world": world, "env": {}, "te": MC.NODE_TE})
    # stage.warm_start: the seed's save (guide A) and another layout's load of it (guide C at 8k)
    (lay_a, st_a), (lay_c, st_c) = GUIDE["A"], GUIDE["C"]
    seed = tmp_path / "attempt-1" / "seed-checkpoint"
    for key, (lay, st, dec) in {
        "warm-save": (lay_a, st_a, {"seed_save": True}),
        "warm-load": (lay_c, st_c, {"warm_from": str(seed)}),
    }.items():
        argv = build(lay, st) + warm_start_flags(
            Decision.from_dict(dec), tmp_path / "attempt-1", st.warmup_iters + st.measure_iters
        )
        cases.append({"key": key, "argv": argv, "world": st.gpus, "env": {}, "te": MC.NODE_TE})
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    out = run_in_tree(megatron_tree(DEV), "tests.job.megatron_probe", str(path), "--no-preflight")
    assert "orch-megatron-trees" in out["megatron"]  # dev's tree answered, not the wheel
    verdicts = out["verdicts"]
    assert "NVTE_CPU_OFFLOAD_V1 should be set to 1" in (verdicts.pop("no-env") or "")
    assert len(verdicts) == len(cases) - 1 > 3 and not {k: v for k, v in verdicts.items() if v}, verdicts
