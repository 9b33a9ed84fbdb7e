"""A candidate's Megatron-LM command line (flags only, no program name), and reading it back.

Why one module: the real job and the twin workload must see the same flags, and the twin must read
its layout from them exactly as Megatron would. Every flag emitted is listed in
orchestrator.plan.flags.FLAGS with the branch whose parser accepts it (main = megatron-core 0.19.2,
dev = Megatron's dev branch, the only code that trains DeepSeek-V4).

Choices (Megatron file:line at dev d48bd6be0a85):
- The pipeline split is the hybrid layer pattern with '|' (pretrain_hybrid.py); VPP = segments / PP.
  Never --pipeline-model-parallel-layout, the VPP layer flags or account-for flags: Megatron rejects
  them together with a pattern (megatron/training/arguments.py:741-921). --num-layers is set to the
  pattern's layer-symbol count, the value Megatron derives, so it does not warn.
- The training recipe (workload.recipe, orchestrator.core.schema.RecipeConfig) is written out in full: --lr
  has no default and the LR scheduler does float(max_lr) (megatron/core/optimizer_param_scheduler.py:158).
  Its overlap flags are what `overlaps` says, and the step-time model hides exactly that much.
- --moe-n-hash-layers is a hybrid layer number, not a block count: pipeline.hash_layer_number.
- --timing-log-level 1: level 2 adds per-microbatch forward/backward timers, and every timer start and
  stop calls torch.cuda.synchronize(), which would perturb the pipeline we are timing.
- --log-interval 1 and --log-memory-interval 1 (a multiple of it): every step's time and memory line.
- --logging-level 20: timers are logged at INFO; the DSv3 examples' 40 hides them.
- Stage attention backend "cudnn" (the packed V4 path): --attention-backend fused (TE's cuDNN fused
  attention) plus --dsa-kernel-backend cudnn for the sparse CSA/HCA kernels.
- the layout's compute precision (the `precision` knob) fp8: --fp8-format e4m3 --fp8-recipe blockwise
  (DeepSeek-style 128x128, Hopper-capable); fp8_cs: --fp8-recipe tensorwise (current scaling, Megatron-Bridge's
  "FP8-CS"); mxfp8: --fp8-recipe mxfp8.
- The GPT path (model.attention_variant mla or gqa: DeepSeek-V3, Qwen3, GPT-OSS on pretrain_gpt.py) writes its
  split as --pipeline-model-parallel-layout (pipeline.gpt_layout) with PP > 1, the leading dense blocks as
  --moe-layer-freq, MLA or GQA flags, and none of the V4 path's (no --spec, CSA/HCA, DSA indexer, mHC, hash
  routing); its router numerics are the model's (ModelConfig.moe_router_*), and CP > 1 runs Megatron's
  ring attention on ordinary (BSHD) batches: --cp-comm-type p2p, no packed-THD flags.
- --deterministic-mode drops --cross-entropy-loss-fusion (megatron/training/determinism.py:24).
- One data path per stage: with stage.packed_sequences every layout, CP=1 included, reads the packed THD
  input (--use-varlen-dataset, the packing scheduler, --calculate-per-token-loss), which dev accepts at CP=1
  (tests/plan/test_argv.py runs dev's validate_args on it). Only the CP flags (--cp-comm-type,
  --cp-partition-mode) depend on CP, so the parity reference (CP=1) and a CP>1 candidate train on the same
  data with the same masks and loss normalisation, and their step times compare one pipeline.
- A training run (`train`, orchestrator.core.schema.TrainConfig: `best --flags --train`): the same layout, model,
  recipe and performance flags on the site's data (--data-path, --split, a real tokenizer), its run length
  (--train-iters), its own learning-rate schedule (TrainConfig's, DeepSeek-V3's pretraining schedule by default:
  peak, floor, warm-up, decay; --lr-decay-iters follows the run unless train.lr_decay_iters is set; the
  measurement keeps the recipe's), --seed, --save/--load, evaluation, TensorBoard (and W&B when a project is
  named) and a coarser --log-interval; never --mock-data or the NullTokenizer. An unset site field is written as
  `<train.FIELD>` (`train_placeholders` names them), which no Megatron run mistakes for a real path.
- The job environment (`megatron_env`): NVTE_CPU_OFFLOAD_V1=1 with --fine-grained-activation-offloading, which
  dev asserts for TE >= 2.10 (megatron/training/arguments.py:2126-2133) and its DSv4-Pro recipe sets
  (examples/moe_recipes/deepseek_v4_pro/gb300/mxfp8_SL4K_256GPU_TP1PP4EP64.yaml:108).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.knobs import KNOB, KNOBS, OPTIM_DTYPES, PRECISIONS, optim_name
from orchestrator.core.schema import TRAIN_SOURCES, ModelConfig, RecipeConfig, StageConfig, TrainConfig
from orchestrator.plan.flags import FLAGS
from orchestrator.plan.layout import Layout
from orchestrator.plan.memory import precision_aware
from orchestrator.plan.params import RATIO_SYMBOL, effective_layers, is_v4
from orchestrator.plan.pipeline import hash_layer_number
from orchestrator.plan.recompute import FULL_RECOMPUTE_NUM_LAYERS

DSV4_SPEC = ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_dsv4_stack_spec")
ATTENTION_BACKENDS = {  # stage.attention_backend -> flags
    "cudnn": ("--attention-backend", "fused", "--dsa-kernel-backend", "cudnn"),
    "fused": ("--attention-backend", "fused"),
    "flash": ("--attention-backend", "flash"),
    "unfused": ("--attention-backend", "unfused"),
    "auto": ("--attention-backend", "auto"),
}
# The GPT path has no DSA kernels: the packed path's "cudnn" is TE's cuDNN fused attention there too.
GPT_BACKEND = {name: ("fused" if name == "cudnn" else name) for name in ATTENTION_BACKENDS}
# a layout's precision -> --fp8-recipe (knobs.PRECISIONS; bf16 writes none)
FP8_RECIPES = {name: recipe for name, recipe in PRECISIONS.items() if recipe is not None}
TIMING_LOG_LEVEL = 1
PIPE, MTP_SEPARATOR = "|", "/"
DEFAULT_RECIPE = RecipeConfig()
RECIPE_GPUS = 256  # the GPU count Megatron dev's DSv4-Pro recipe (and its 60-minute timeout) is written for


@dataclass(frozen=True)
class Overlap:
    """Which communication the argv overlaps with compute (the step-time model reads it)."""

    grad_reduce: bool  # --overlap-grad-reduce: the gradient reduce-scatter (all-reduce) runs during backward
    param_gather: bool  # --overlap-param-gather: the parameter all-gather runs during the next forward
    expert_a2a: bool = False  # --overlap-moe-expert-parallel-comm: EP dispatch/combine under another microbatch


def overlaps(recipe: RecipeConfig, stage: StageConfig) -> Overlap:
    """The overlap flags emitted for this recipe and stage. --overlap-param-gather needs the distributed
    optimizer and --overlap-grad-reduce (megatron/training/arguments.py:1071-1079), so it is dropped without."""
    grad = bool(recipe.overlap_grad_reduce)
    return Overlap(
        grad,
        grad and bool(recipe.overlap_param_gather) and bool(stage.use_distributed_optimizer),
        bool(recipe.overlap_moe_expert_parallel_comm),
    )


def distributed_timeout_minutes(recipe: RecipeConfig, gpus: int) -> int:
    """--distributed-timeout-minutes: the recipe's base (set for its 256 GPUs) plus its step per 1,024 GPUs more."""
    extra = max(0.0, (gpus - RECIPE_GPUS) / 1024) * recipe.distributed_timeout_min_per_1k_gpus
    return math.ceil(recipe.distributed_timeout_min + extra)


def pattern_segments(pattern: str) -> int:
    """Pipeline segments in a hybrid pattern: '|'-separated pieces of the part before the first '/'."""
    return pattern.split(MTP_SEPARATOR)[0].count(PIPE) + 1


def compress_ratios(pattern: str) -> list[int]:
    """--csa-compress-ratios in dev's compact form: one ratio per W/C/H attention symbol of the whole pattern
    (MTP sections included), read off the symbols. Dev fixes each symbol's ratio (W 0, C 4, H 128) and
    accepts a list of exactly that length, or one entry per symbol with 0 on every non-attention one
    (megatron/training/argument_utils.py:306-365 at dev d48bd6be); the model's per-block list is longer than
    the pattern whenever a stage builds fewer blocks, which dev refuses."""
    ratio_of = {sym: r for r, sym in RATIO_SYMBOL.items()}
    return [ratio_of[ch] for ch in pattern if ch in ratio_of]


def pattern_layers(pattern: str) -> int:
    """Layer symbols in the main pattern: what Megatron derives num_layers from."""
    return sum(ch not in f"{PIPE} " for ch in pattern.split(MTP_SEPARATOR)[0])


class _Argv:
    """Collects flags; refuses any flag not in FLAGS so every emitted flag has a known branch."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, flag: str, *values: object) -> None:
        if flag not in FLAGS:
            raise KeyError(f"{flag} is not in argv.FLAGS: add it with its branch (main/dev)")
        self.items.append(flag)
        self.items.extend(str(v) for v in values)


def _knob(a: _Argv, layout: Layout, name: str) -> None:
    """A knob carried by one flag (its first in the registry): a number or a word is written as the flag's
    value, a switch only when True, an optional value only when set (absent = Megatron's default)."""
    k, value = KNOB[name], getattr(layout, name)
    if value is True:
        a.add(k.flags[0])
    elif value is not None and value is not False:
        a.add(k.flags[0], k.base(value))


def _parallel(a: _Argv, layout: Layout) -> None:
    _knob(a, layout, "tp")
    _knob(a, layout, "pp")
    _knob(a, layout, "cp")
    _knob(a, layout, "ep")
    _knob(a, layout, "etp")
    if layout.tp > 1:
        a.add("--sequence-parallel")  # MoE with attention-TP > 1 and no SP fails in training
    _knob(a, layout, "use_tp_pp_dp_mapping")


def _model(a: _Argv, model: ModelConfig, recipe: RecipeConfig, layer_pattern: str) -> None:
    dsv4 = model.attention_variant == "dsv4_hybrid"
    a.add("--num-layers", pattern_layers(layer_pattern))
    a.add("--hidden-size", model.hidden_size)
    a.add("--ffn-hidden-size", model.ffn_hidden_size)
    a.add("--num-attention-heads", model.num_attention_heads)
    a.add("--kv-channels", model.kv_channels)
    for flag in ("--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"):
        a.add(flag)
    a.add("--normalization", "RMSNorm")
    a.add("--norm-epsilon", recipe.norm_epsilon)
    a.add("--position-embedding-type", "rope")
    a.add("--rotary-base", recipe.rotary_base)
    a.add("--rotary-scaling-factor", recipe.rotary_scaling_factor)
    a.add("--mscale", recipe.mscale)
    a.add("--mscale-all-dim", recipe.mscale_all_dim)
    a.add("--hybrid-layer-pattern", layer_pattern)
    if model.mtp_num_layers:
        a.add("--mtp-num-layers", model.mtp_num_layers)
    a.add("--multi-latent-attention")
    a.add("--q-lora-rank", model.q_lora_rank)
    if not dsv4:  # dev derives kv_lora_rank (and qk_head_dim) from v_head_dim - qk_pos_emb_head_dim
        a.add("--kv-lora-rank", model.kv_lora_rank)
    a.add("--qk-pos-emb-head-dim", model.qk_pos_emb_head_dim)
    a.add("--v-head-dim", model.v_head_dim)
    a.add("--qk-layernorm")
    if dsv4:
        a.add("--spec", *DSV4_SPEC)
        a.add("--experimental-attention-variant", "dsv4_hybrid")
        a.add("--o-groups", model.o_groups)
        a.add("--o-lora-rank", model.o_lora_rank)
        a.add("--csa-window-size", model.csa_window_size)
        a.add("--csa-compress-ratios", "[" + ",".join(str(r) for r in compress_ratios(layer_pattern)) + "]")
        a.add("--csa-compress-rotary-base", recipe.csa_compress_rotary_base)
        a.add("--original-max-position-embeddings", recipe.original_max_position_embeddings)
    a.add("--dsa-indexer-n-heads", model.dsa_indexer_heads)
    a.add("--dsa-indexer-head-dim", model.dsa_indexer_head_dim)
    a.add("--dsa-indexer-topk", model.dsa_indexer_topk)
    a.add("--dsa-indexer-loss-coeff", recipe.dsa_indexer_loss_coeff)
    if recipe.dsa_indexer_use_sparse_loss:
        a.add("--dsa-indexer-use-sparse-loss")
    if model.mtp_num_layers:
        a.add("--mtp-loss-scaling-factor", recipe.mtp_loss_scaling_factor)
    if model.hyper_connection_streams and model.hyper_connection_streams > 1:
        a.add("--enable-hyper-connections")
        a.add("--num-residual-streams", model.hyper_connection_streams)
        a.add("--use-fused-mhc")
        a.add("--mhc-sinkhorn-iterations", recipe.mhc_sinkhorn_iterations)


def _gpt_model(
    a: _Argv, model: ModelConfig, stage: StageConfig, recipe: RecipeConfig, layout: Layout, split: str
) -> None:
    """The GPT path's model flags (pretrain_gpt.py): MLA or GQA attention, no V4 structure."""
    a.add("--num-layers", effective_layers(model, stage))
    a.add("--hidden-size", model.hidden_size)
    a.add("--ffn-hidden-size", model.ffn_hidden_size)
    a.add("--num-attention-heads", model.num_attention_heads)
    a.add("--kv-channels", model.kv_channels)
    a.add("--quick-geglu" if model.glu_activation == "quick_geglu" else "--swiglu")
    if not model.add_bias_linear:
        a.add("--disable-bias-linear")
    a.add("--untie-embeddings-and-output-weights")
    a.add("--normalization", "RMSNorm")
    a.add("--norm-epsilon", recipe.norm_epsilon)
    a.add("--position-embedding-type", "rope")
    a.add("--rotary-base", model.rotary_base or recipe.rotary_base)
    if layout.pp > 1:
        a.add("--pipeline-model-parallel-layout", split)
    if model.mtp_num_layers:
        a.add("--mtp-num-layers", model.mtp_num_layers)
        a.add("--mtp-loss-scaling-factor", recipe.mtp_loss_scaling_factor)
    if model.attention_variant == "mla":
        a.add("--multi-latent-attention")
        if model.q_lora_rank:
            a.add("--q-lora-rank", model.q_lora_rank)
        a.add("--kv-lora-rank", model.kv_lora_rank)
        a.add("--qk-head-dim", model.qk_head_dim)
        a.add("--qk-pos-emb-head-dim", model.qk_pos_emb_head_dim)
        a.add("--v-head-dim", model.v_head_dim)
    elif model.num_query_groups and model.num_query_groups != model.num_attention_heads:
        a.add("--group-query-attention")
        a.add("--num-query-groups", model.num_query_groups)
    if model.qk_layernorm:
        a.add("--qk-layernorm")
    if model.window_size:
        a.add("--window-size", f"{model.window_size - 1},0")
        if model.window_attn_skip_freq:
            a.add("--window-attn-skip-freq", model.window_attn_skip_freq)


def _gpt_moe(a: _Argv, model: ModelConfig, stage: StageConfig, recipe: RecipeConfig, layout: Layout) -> None:
    """The GPT path's MoE flags: the model's own router (DeepSeek-V3's grouped sigmoid, Qwen3's softmax)."""
    a.add("--num-experts", model.num_experts)
    a.add("--moe-router-topk", model.moe_router_topk)
    a.add("--moe-ffn-hidden-size", model.moe_ffn_hidden_size)
    if model.moe_shared_expert_intermediate_size:
        a.add("--moe-shared-expert-intermediate-size", model.moe_shared_expert_intermediate_size)
    n, dense = effective_layers(model, stage), min(model.num_dense_layers, effective_layers(model, stage))
    if dense:
        a.add("--moe-layer-freq", f"([0]*{dense}+[1]*{n - dense})")
    a.add("--moe-grouped-gemm")
    _dispatcher(a, recipe, layout)
    a.add("--moe-router-load-balancing-type", model.moe_router_load_balancing_type)
    a.add("--moe-aux-loss-coeff", recipe.moe_aux_loss_coeff)
    a.add("--moe-router-score-function", model.moe_router_score_function)
    if model.moe_router_topk_scaling_factor is not None:
        a.add("--moe-router-topk-scaling-factor", model.moe_router_topk_scaling_factor)
    if model.moe_router_enable_expert_bias:
        a.add("--moe-router-enable-expert-bias")
        a.add("--moe-router-bias-update-rate", recipe.moe_router_bias_update_rate)
    if model.moe_router_num_groups:
        a.add("--moe-router-num-groups", model.moe_router_num_groups)
        a.add("--moe-router-group-topk", model.moe_router_group_topk)
    a.add("--moe-router-dtype", "fp32")
    if recipe.moe_permute_fusion:
        a.add("--moe-permute-fusion")
    if recipe.moe_router_fusion:
        a.add("--moe-router-fusion")
    if recipe.overlap_moe_expert_parallel_comm:  # Megatron's 1F1B A2A overlap wants the split weight gradients
        a.add("--overlap-moe-expert-parallel-comm")
        a.add("--delay-wgrad-compute")


def fixed_receive_buffer(layout: Layout) -> bool:
    """Whether the layout's dispatcher gets --moe-expert-rank-capacity-factor: dev's NCCL-EP sizes its receive
    buffer with it and refuses None, so its shapes are static (the step model charges it no host wait)."""
    return layout.dispatcher == "flex" and layout.flex_backend == "ncclep"


def _dispatcher(a: _Argv, recipe: RecipeConfig, layout: Layout) -> None:
    _knob(a, layout, "dispatcher")
    if layout.dispatcher == "flex":
        if not layout.flex_backend:
            raise ValueError("dispatcher flex needs flex_backend (deepep | hybridep | ncclep)")
        _knob(a, layout, "flex_backend")  # never the deprecated --moe-enable-deepep
        if fixed_receive_buffer(layout):
            a.add("--moe-expert-rank-capacity-factor", recipe.ncclep_rank_capacity_factor)
    _knob(a, layout, "capacity_factor")


def _moe(a: _Argv, model: ModelConfig, recipe: RecipeConfig, layout: Layout, layer_pattern: str) -> None:
    a.add("--num-experts", model.num_experts)
    a.add("--moe-router-topk", model.moe_router_topk)
    a.add("--moe-ffn-hidden-size", model.moe_ffn_hidden_size)
    if model.moe_shared_expert_intermediate_size:
        a.add("--moe-shared-expert-intermediate-size", model.moe_shared_expert_intermediate_size)
    a.add("--moe-grouped-gemm")
    _dispatcher(a, recipe, layout)
    a.add("--moe-router-load-balancing-type", model.moe_router_load_balancing_type)
    a.add("--moe-aux-loss-coeff", recipe.moe_aux_loss_coeff)
    a.add("--moe-router-score-function", "sqrtsoftplus")
    scaling = model.moe_router_topk_scaling_factor  # V4-Flash sets its own (1.5); V4-Pro takes the recipe's
    a.add("--moe-router-topk-scaling-factor", recipe.moe_router_topk_scaling_factor if scaling is None else scaling)
    a.add("--moe-router-enable-expert-bias")
    a.add("--moe-router-bias-update-rate", recipe.moe_router_bias_update_rate)
    a.add("--moe-router-dtype", "fp32")
    a.add("--activation-func-clamp-value", recipe.activation_func_clamp_value)
    if recipe.moe_permute_fusion:
        a.add("--moe-permute-fusion")
    if recipe.moe_router_fusion:
        a.add("--moe-router-fusion")
    if recipe.overlap_moe_expert_parallel_comm:
        a.add("--overlap-moe-expert-parallel-comm")
        a.add("--delay-wgrad-compute")
    if model.moe_n_hash_layers:  # the first n MoE blocks, as hybrid layer numbers
        a.add("--moe-n-hash-layers", hash_layer_number(layer_pattern, model.moe_n_hash_layers))


def _memory(a: _Argv, layout: Layout) -> None:
    if layout.recompute == ("full",):
        a.add("--recompute-granularity", "full")
        a.add("--recompute-method", "uniform")
        a.add("--recompute-num-layers", FULL_RECOMPUTE_NUM_LAYERS)
    elif "full" in layout.recompute:
        raise ValueError(f"full recompute cannot be combined with modules: {layout.recompute}")
    elif layout.recompute:
        a.add("--recompute-granularity", "selective")
        a.add("--recompute-modules", *layout.recompute)
    if layout.offload:
        a.add("--fine-grained-activation-offloading")
        a.add("--offload-modules", *layout.offload)


OFFLOAD_ENV = {"NVTE_CPU_OFFLOAD_V1": "1"}  # dev A:2126-2133: fine-grained offloading with TE >= 2.10


def megatron_env(layout: Layout) -> dict[str, str]:
    """The environment variables this layout's Megatron job needs beyond the cluster's (JobSpec.env adds them)."""
    return dict(OFFLOAD_ENV) if layout.offload else {}


PROBE_FLAG = "--fake-process-group"  # dev megatron/training/arguments.py:4312, initialize.py:343 (torch's FakeStore)
PROBE_DISPATCHER = "alltoall"  # dev arguments.py:1932-1935: the fake process group refuses the flex dispatcher
FLEX_ONLY_FLAGS = ("--moe-flex-dispatcher-backend", "--moe-expert-rank-capacity-factor")


def probe_argv(argv: Sequence[str]) -> list[str]:
    """A one-GPU rank probe's flags: the layout's own plus `--fake-process-group`, with which one process builds
    and trains the partition of rank RANK of a WORLD_SIZE job and skips every collective (dev
    megatron/training/initialize.py:343-350: backend 'fake' over torch's FakeStore; validate_args turns off the
    NaN check and the gloo groups for it, arguments.py:1932-1941). dev refuses the flex dispatcher with it
    (arguments.py:1933-1935), so a flex layout is probed with alltoall: its dispatcher buffers are part of
    what a probe cannot see, as NCCL's are (the margin learned from full-scale runs covers them)."""
    out: list[str] = []
    skip = False
    it = list(argv)
    for i, tok in enumerate(it):
        if skip:
            skip = False
            continue
        if tok in FLEX_ONLY_FLAGS:
            skip = i + 1 < len(it) and not it[i + 1].startswith("--")
            continue
        if tok == "--moe-token-dispatcher-type" and i + 1 < len(it) and it[i + 1] == "flex":
            out += [tok, PROBE_DISPATCHER]
            skip = True
            continue
        if tok == PROBE_FLAG:
            continue
        out.append(tok)
    return [*out, PROBE_FLAG]


def probe_env(rank: int, world_size: int, local_rank: int = 0) -> dict[str, str]:
    """The rank variables of a rank probe: the probed rank of the full job's world on this task's one GPU."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank)}


def _cp(a: _Argv, stage: StageConfig, layout: Layout, mock_data: bool, v4: bool = True) -> None:
    """The CP flags (CP>1 only) and the stage's data path, the same for every layout of the stage."""
    if layout.cp > 1:
        a.add("--cp-comm-type", "p2p")
        if v4:
            a.add("--cp-partition-mode", stage.cp_partition_mode)  # dsv4_hybrid with CP requires contiguous
    if not v4:  # the GPT path: ordinary batches for every layout (ring attention when CP > 1)
        return
    if stage.packed_sequences:  # contiguous CP needs THD input from the packing scheduler; CP=1 reads it too
        a.add("--sequence-packing-scheduler", "dp_balanced")
        a.add("--max-seqlen-per-dp-cp-rank", stage.seq_length // layout.cp)
        a.add("--calculate-per-token-loss")
        a.add("--use-varlen-dataset")
        if mock_data:
            s = stage.seq_length
            cfg = {
                "mode": "distribution",
                "type": "lognormal",
                "format": "thd",
                "min_seq_len": s,
                "max_seq_len": s,
                "mean_seq_len": s,
                "lognormal_sigma": 1.1,
            }
            a.add("--varlen-mock-dataset-config-json", json.dumps(cfg, separators=(",", ":")))


def _optimizer(
    a: _Argv,
    model: ModelConfig,
    stage: StageConfig,
    recipe: RecipeConfig,
    layout: Layout,
    train_iters: int,
    train: TrainConfig | None = None,
) -> None:
    r = recipe
    a.add("--optimizer", model.optimizer)
    if stage.use_distributed_optimizer:
        a.add("--use-distributed-optimizer")
    if precision_aware(model, stage, layout.optim):  # the dtypes memory.optimizer_bytes counts
        grads, params, avg, avg_sq = OPTIM_DTYPES[layout.optim]
        a.add("--use-precision-aware-optimizer")
        a.add("--main-grads-dtype", grads)
        a.add("--main-params-dtype", params)
        a.add("--exp-avg-dtype", avg)
        a.add("--exp-avg-sq-dtype", avg_sq)
    if r.grad_reduce_in_bf16:  # the BF16 grad buffer memory.optimizer_bytes counts
        a.add("--grad-reduce-in-bf16")
    ov = overlaps(r, stage)
    if ov.grad_reduce:
        a.add("--overlap-grad-reduce")
    if ov.param_gather:
        a.add("--overlap-param-gather")
    sched: RecipeConfig | TrainConfig = train if train is not None else r  # a training run's own schedule
    a.add("--lr", sched.lr)
    a.add("--min-lr", sched.min_lr)
    a.add("--lr-warmup-init", sched.lr_warmup_init)
    a.add("--lr-warmup-iters", sched.lr_warmup_iters)
    a.add("--lr-decay-style", sched.lr_decay_style)
    a.add("--lr-decay-iters", sched.lr_decay_iters if sched.lr_decay_iters is not None else train_iters)
    a.add("--init-method-std", r.init_method_std)
    a.add("--clip-grad", r.clip_grad)
    a.add("--weight-decay", r.weight_decay)
    a.add("--attention-dropout", r.attention_dropout)
    a.add("--hidden-dropout", r.hidden_dropout)
    a.add("--adam-beta1", r.adam_beta1)  # Adam, and Muon's scalar optimizer
    a.add("--adam-beta2", r.adam_beta2)
    a.add("--adam-eps", r.adam_eps)
    if str(model.optimizer).endswith("muon"):
        a.add("--muon-momentum", r.muon_momentum)
        a.add("--muon-num-ns-steps", r.muon_num_ns_steps)
        a.add("--muon-scale-mode", r.muon_scale_mode)


def _runtime(a: _Argv, stage: StageConfig, recipe: RecipeConfig) -> None:
    if recipe.cross_entropy_loss_fusion and not stage.deterministic_mode:
        a.add("--cross-entropy-loss-fusion")
        a.add("--cross-entropy-fusion-impl", "native")  # te is refused (megatron/training/arguments.py:1822)
    if recipe.manual_gc_interval > 0:
        a.add("--manual-gc")
        a.add("--manual-gc-interval", recipe.manual_gc_interval)
    a.add("--distributed-timeout-minutes", distributed_timeout_minutes(recipe, stage.gpus))


def megatron_argv(
    model: ModelConfig,
    stage: StageConfig,
    layout: Layout,
    *,
    layer_pattern: str,
    train_iters: int,
    mock_data: bool = True,
    recipe: RecipeConfig | None = None,
    extra: Iterable[str] = (),
    train: TrainConfig | None = None,
) -> list[str]:
    """Megatron flags for one candidate. model: ModelConfig, stage: StageConfig (orchestrator.core.schema).

    layer_pattern is the hybrid pattern with '|' between PP x VPP segments (orchestrator.plan.pipeline).
    recipe: the workload's training recipe (None: RecipeConfig's defaults, the dev DSv4-Pro recipe).
    train: a training run's data, length, checkpoints and evaluation in place of the measurement's (then
    train_iters and mock_data are ignored). `extra` is appended last (argparse: a later flag wins).
    """
    recipe = recipe or DEFAULT_RECIPE
    if train is not None:
        train_iters, mock_data = train.train_iters, False
    segments = pattern_segments(layer_pattern)
    if segments != layout.pp * layout.vpp:
        raise ValueError(f"pattern has {segments} segments, layout needs PP x VPP = {layout.pp * layout.vpp}")
    a = _Argv()
    _parallel(a, layout)
    _knob(a, layout, "mbs")
    a.add("--global-batch-size", stage.global_batch)
    a.add("--seq-length", stage.seq_length)
    a.add("--max-position-embeddings", stage.seq_length)
    v4 = is_v4(model)
    if v4:
        _model(a, model, recipe, layer_pattern)
        _moe(a, model, recipe, layout, layer_pattern)
    else:
        _gpt_model(a, model, stage, recipe, layout, layer_pattern)
        _gpt_moe(a, model, stage, recipe, layout)
    _memory(a, layout)
    _optimizer(a, model, stage, recipe, layout, train_iters, train)
    a.add("--bf16")
    if layout.precision in FP8_RECIPES:
        a.add("--fp8-format", "e4m3")
        a.add("--fp8-recipe", FP8_RECIPES[layout.precision])
    if stage.attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {stage.attention_backend!r}: {sorted(ATTENTION_BACKENDS)}")
    backend = (
        ATTENTION_BACKENDS[stage.attention_backend]
        if v4
        else ("--attention-backend", GPT_BACKEND[stage.attention_backend])
    )
    for flag, value in zip(backend[::2], backend[1::2]):
        a.add(flag, value)
    a.add("--transformer-impl", "transformer_engine" if stage.transformer_engine else "local")
    if stage.deterministic_mode:
        a.add("--deterministic-mode")
    _runtime(a, stage, recipe)
    if train is not None:
        _train_data(a, train)
    elif mock_data:
        a.add("--mock-data")
        a.add("--tokenizer-type", "NullTokenizer")
        a.add("--vocab-size", model.vocab_size)
    _cp(a, stage, layout, mock_data, v4)
    written = set(a.items)
    for k in KNOBS:  # a plain knob no section above places (a new one in the registry): its flag, here
        if k.name not in _READ and k.flags[0] not in written:
            _knob(a, layout, k.name)
    a.add("--train-iters", train_iters)
    if train is not None:
        _train_run(a, train, f"{model.name}-{stage.name}")
    else:
        a.add("--eval-iters", 0)
        a.add("--log-interval", 1)
    a.add("--log-throughput")
    a.add("--timing-log-level", TIMING_LOG_LEVEL)
    a.add("--timing-log-option", "minmax")
    a.add("--log-memory-interval", train.log_interval if train is not None else 1)
    a.add("--logging-level", 20)
    return a.items + [str(x) for x in extra]


def train_placeholders(train: TrainConfig) -> list[str]:
    """The TrainConfig fields a site has not filled (None): written as `<train.FIELD>` in the flags."""
    return [name for name in ("data_path", "tokenizer_model", "save") if getattr(train, name) is None]


def _placeholder(train: TrainConfig, name: str) -> str:
    value = getattr(train, name)
    return f"<train.{name}>" if value is None else str(value)


def _train_data(a: _Argv, train: TrainConfig) -> None:
    """A training run's data: the site's indexed dataset and a real tokenizer (never --mock-data)."""
    a.add("--data-path", *(train.data_path or [_placeholder(train, "data_path")]))
    a.add("--split", train.split)
    a.add("--tokenizer-type", train.tokenizer_type)
    a.add("--tokenizer-model", _placeholder(train, "tokenizer_model"))


def _train_run(a: _Argv, train: TrainConfig, name: str) -> None:
    """A training run's checkpoints (load: save unless set), evaluation, seed and logging (TensorBoard under
    the checkpoints unless set; W&B when a project is named, the run called `name` unless set)."""
    save = _placeholder(train, "save")
    a.add("--save", save)
    a.add("--load", train.load or save)
    a.add("--save-interval", train.save_interval)
    a.add("--eval-interval", train.eval_interval)
    a.add("--eval-iters", train.eval_iters)
    a.add("--log-interval", train.log_interval)
    a.add("--seed", train.seed)
    a.add("--tensorboard-dir", train.tensorboard_dir or f"{save}/tensorboard")
    if train.wandb_project:
        a.add("--wandb-project", train.wandb_project)
        a.add("--wandb-exp-name", train.wandb_exp_name or name)


def train_schedule(train: TrainConfig, recipe: RecipeConfig | None = None) -> list[tuple[str, object, str]]:
    """(TrainConfig field, value in the flags, where it came from) for a training run's schedule and logging,
    then the recipe values it keeps: a field left at its schema default names its source
    (schema.TRAIN_SOURCES), one set in conf/train or on the command line says so."""
    defaults = TrainConfig()
    save = _placeholder(train, "save")
    shown = {
        "lr_decay_iters": train.lr_decay_iters if train.lr_decay_iters is not None else train.train_iters,
        "tensorboard_dir": train.tensorboard_dir or f"{save}/tensorboard",
        "wandb_project": train.wandb_project or "off",
    }
    out: list[tuple[str, object, str]] = []
    for name, origin in TRAIN_SOURCES.items():
        value = getattr(train, name)
        source = f"default: {origin}" if value == getattr(defaults, name) else f"set: train.{name}"
        out.append((name, shown.get(name, value), source))
    r = recipe or DEFAULT_RECIPE
    kept = ("clip_grad", "weight_decay", "adam_beta1", "adam_beta2", "init_method_std")
    out += [(name, getattr(r, name), "performance recipe (workload.recipe)") for name in kept]
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, (_, kind) in FLAGS.items():
        if kind is bool:
            p.add_argument(flag, action="store_true")
        elif kind is list:
            p.add_argument(flag, nargs="+")
        else:
            p.add_argument(flag, type=kind)
    return p


def parse_flags(argv: Sequence[str]) -> dict[str, object]:
    """Flags keyed by argparse dest (tensor_model_parallel_size ...). Those in FLAGS are typed, and
    absent ones are None (False for switches). Others (e.g. extra_args such as
    --moe-router-force-load-balancing) are kept untyped: no value -> True, one -> str, more -> list."""
    ns, rest = _parser().parse_known_args(list(argv))
    out = vars(ns)
    name, values = None, []
    for tok in [*rest, "--"]:
        if tok.startswith("--"):
            if name:
                out[name] = True if not values else values[0] if len(values) == 1 else list(values)
            name, _, value = tok[2:].partition("=")
            name, values = name.replace("-", "_"), [value] if value else []
        elif name:
            values.append(tok)
    return out


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


Flags = dict[str, Any]  # parse_flags' answer


def _vpp(f: Flags, kw: dict[str, Any]) -> int:
    pattern = f["hybrid_layer_pattern"] or f["pipeline_model_parallel_layout"]
    return max(pattern_segments(pattern) // kw["pp"], 1) if pattern else 1


def _recompute(f: Flags, kw: dict[str, Any]) -> tuple[str, ...]:
    if f["recompute_granularity"] == "full":
        return ("full",)
    if f["recompute_granularity"] == "selective":
        return tuple(f["recompute_modules"] or ("core_attn",))  # Megatron's default module
    return ()


def _offload(f: Flags, kw: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f["offload_modules"] or ()) if f["fine_grained_activation_offloading"] else ()


def _optim(f: Flags, kw: dict[str, Any]) -> str:
    """The OPTIM_DTYPES name of the flags' optimizer dtypes ("fp32" without --use-precision-aware-optimizer)."""
    if not f["use_precision_aware_optimizer"]:
        return "fp32"
    return optim_name(f["main_grads_dtype"] or "fp32", f["exp_avg_dtype"] or "fp32")


def _precision(f: Flags, kw: dict[str, Any]) -> str:
    """The PRECISIONS name of the flags' --fp8-recipe ("bf16" without --fp8-format: no FP8 GEMMs)."""
    if not f["fp8_format"]:
        return "bf16"
    recipe = f["fp8_recipe"] or "delayed"  # Megatron's default recipe
    names = [name for name, r in PRECISIONS.items() if r == recipe]
    if not names:
        known = ", ".join(FP8_RECIPES.values())
        raise ValueError(f"--fp8-recipe {recipe}: not a precision the planner knows ({known})")
    return names[0]


def _flex_backend(f: Flags, kw: dict[str, Any]) -> str | None:
    return (f["moe_flex_dispatcher_backend"] or "deepep") if kw["dispatcher"] == "flex" else None


# The knobs Megatron does not read as one flag's value (absent = the Layout default): f(flags, knobs read so far)
_READ: dict[str, Callable[[Flags, dict[str, Any]], Any]] = {
    "vpp": _vpp,
    "etp": lambda f, kw: f["expert_tensor_parallel_size"] or kw["tp"],  # None -> TP, as Megatron
    "recompute": _recompute,
    "offload": _offload,
    "dispatcher": lambda f, kw: f["moe_token_dispatcher_type"] or "allgather",  # Megatron's default
    "flex_backend": _flex_backend,
    "optim": _optim,
    "precision": _precision,
}


def layout_from_argv(argv: Sequence[str]) -> Layout:
    """Read a Layout back from Megatron flags (the inverse of megatron_argv's layout part): every knob of the
    registry, from its flag with Megatron's default when absent (_READ where Megatron reads it otherwise)."""
    f = parse_flags(argv)
    kw: dict[str, Any] = {}
    for k in KNOBS:  # registry order: pp before vpp, tp before etp, dispatcher before flex_backend
        if k.name in _READ:
            kw[k.name] = _READ[k.name](f, kw)
        else:
            value = f[_dest(k.flags[0])]
            kw[k.name] = bool(value) if k.base is bool else k.default if value is None else value
    return Layout(**kw)


def shell_join(argv: Sequence[str], multiline: bool = False) -> str:
    """Copy-pasteable shell text (quotes the pattern's '|' and the JSON); multiline puts each flag and
    its values on its own line, joined with backslash-newline."""
    if not multiline:
        return shlex.join(list(argv))
    lines: list[list[str]] = []
    for tok in argv:
        if tok.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(tok)
    return " \\\n".join(shlex.join(line) for line in lines)
