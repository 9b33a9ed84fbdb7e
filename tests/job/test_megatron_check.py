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

from orchestrator.core.schema import RecipeConfig
from orchestrator.job import megatron_check as MC
from orchestrator.plan import argv as A
from orchestrator.plan import memory
from tests.plan.test_argv import CONFIGS, MODEL, build, pattern_for

ROOT = Path(__file__).resolve().parents[2]
RECIPE = RecipeConfig()


@pytest.fixture(scope="module")
def megatron():
    return MC.import_megatron()


def drop(argv: list[str], flag: str) -> list[str]:
    """argv without `flag` and its value."""
    i = argv.index(flag)
    return argv[:i] + argv[i + 2 :]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_guide_configs_are_training_ready(megatron, name):
    layout, stage = CONFIGS[name]
    assert MC.check_candidate(build(layout, stage), stage.gpus) is None


def test_plan_argv_0_carries_the_recipe_and_megatron_accepts_it(megatron):
    """`plan +stage=1k --argv 0` (the CLI) has --lr and the overlap / fusion flags, and is training-ready."""
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "+stage=1k", "--argv", "0"],
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


def test_no_lr_fails_in_megatrons_scheduler(megatron):
    """--lr defaults to None (megatron/training/arguments.py:3892-3894 at dev d48bd6be0a85) and the scheduler
    does float(max_lr) (megatron/core/optimizer_param_scheduler.py:158; :148 in 0.19.2): setup dies."""
    layout, stage = CONFIGS["A"]
    msg = MC.check_candidate(drop(build(layout, stage), "--lr"), stage.gpus)
    assert msg is not None and msg.startswith("TypeError: float()")


def test_megatrons_own_messages_come_back(megatron):
    layout, stage = CONFIGS["A"]
    argv = build(layout, stage)
    assert "divisible" in (MC.check_candidate(argv, 1000) or "")  # validate_args: N = 1000 breaks the batch
    assert "unrecognized arguments: --bogus" in (MC.check_candidate([*argv, "--bogus"], stage.gpus) or "")
    plain = replace(stage, use_distributed_optimizer=False)  # param gather needs the distributed optimizer
    assert MC.check_candidate(build(layout, plain), stage.gpus) is None  # argv.overlaps drops it
    forced = [*build(layout, plain), "--overlap-param-gather"]
    assert "--overlap-param-gather only supported" in (MC.check_candidate(forced, stage.gpus) or "")


def test_megatron_parses_the_recipe_and_builds_the_optimizer_state_the_memory_model_counts(megatron):
    """Megatron's own optimizer config from the parsed args: Adam with FP32 master weights and FP32 moments
    (no precision-aware optimizer) = memory.ADAM_BYTES per parameter; FP32 main grads for bf16
    (megatron/training/arguments.py:1325-1327 at dev) = memory.GRAD_BYTES."""
    import torch

    layout, stage = CONFIGS["A"]
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
