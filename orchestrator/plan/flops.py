"""Model FLOPs of a V4-shaped MoE step, and MFU with a named peak.

Why: the guide warns that 6 x 1.6T x tokens overstates the work of a MoE; MFU must count activated
experts (k routed + shared) and the real V4 attention (CSA/HCA compressed attention + sliding window
+ indexer, not a dense S^2 term in every layer), and report recompute FLOPs separately.

Per token, forward (a multiply-add = 2 FLOPs; S = seq_length; n_h heads of width d = v_head_dim):
  linear      2 x (attention + router + shared + mHC [+ dense MLP]) parameters of the block
  experts     2 x k x P_expert
  window      4 n_h d W_eff            W_eff = mean over positions of min(W, pos+1), W = csa_window_size
  compressed  4 n_h d C_eff            ratio r > 0: C_eff = mean over positions of min(K, pos / r),
                                       K = dsa_indexer_topk for CSA (r = 4), all entries for HCA (r = 128)
  indexer     2 H_i d_i (S / 2r)       CSA only: scores every earlier compressed entry
  head        2 h V per use, used 1 + mtp_num_layers times (main logits + each MTP depth)
  MTP depth   one block + eh_proj 2 x 2h x h
Per step: model FLOPs = 3 x forward (backward = 2 x forward) x B x S tokens, recompute excluded.

The GPT path (mla, gqa; params.py has their projections): core attention 2 n_h (d_qk + d_r) S_eff + 2 n_h d_v S_eff
(MLA) or 4 n_h d S_eff (GQA), S_eff = mean over positions of the keys attended: (S+1)/2 causal ~ S/2, min(W, pos+1)
in a sliding-window layer (params.is_window_block). This is Megatron's own count (megatron/training/training.py
num_floating_point_operations, 0.19.2: transformer_flops' MLA and GQA terms, moe_layer_flops, logits and MTP),
except in three named places that tests/plan/test_gpt_models.py checks: the router GEMM (2 E h per MoE token)
is counted here, a sliding window attends W keys (Megatron counts S/2), and a quick-GEGLU expert
(GPT-OSS, --quick-geglu, no --swiglu) runs three matrices where Megatron's count takes two (its
ffn_expansion_factor is 3 only with --swiglu).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from orchestrator.core import knobs
from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig
from orchestrator.plan.layout import Layout
from orchestrator.plan.params import (
    ModelKey,
    _Frozen,
    attention_params,
    block_ratios,
    effective_layers,
    is_moe_block,
    is_v4,
    is_window_block,
    mhc_params,
    model_key,
    mtp_ratio,
    p_expert,
)
from orchestrator.plan.recompute import FULL, repeated

# The embedding lookup and its sparse gradient are memory-bound; counted as this fraction of a mean
# block when the pipeline split balances segment 0 (a prior, not a measurement).
EMBEDDING_COST_BLOCKS = 0.1


@dataclass(frozen=True)
class BlockFlops:
    """Forward FLOPs per token of one block, split by the efficiency class that runs them."""

    gemm: float  # dense projections: attention linears, router, shared expert, mHC, dense MLP
    expert: float  # routed expert GEMMs (k experts)
    attn: float  # core attention: window + compressed + indexer scores
    # pieces that selective recompute repeats (recompute.RECOMPUTE names them), with attn and expert
    q_up: float
    mhc: float
    shared: float
    router: float
    mlp: float  # dense MLP (dense blocks only)
    act: float  # SwiGLU elementwise of routed + shared experts
    norm: float

    @property
    def total(self) -> float:
        return self.gemm + self.expert + self.attn


@dataclass(frozen=True)
class FlopProfile:
    """Per-token forward FLOPs of every block and of the extras, for one model, S and block count."""

    blocks: tuple[BlockFlops, ...]
    head: float  # one output-head use (2 h V)
    mtp_block: BlockFlops | None
    mtp_extra: float  # eh_proj of one MTP depth
    mtp_layers: int

    @property
    def last_extra(self) -> float:
        """Work the last segment carries beyond its blocks: logits of main + MTP heads, MTP blocks."""
        mtp = (self.mtp_block.total + self.mtp_extra) if self.mtp_block else 0.0
        return self.head * (1 + self.mtp_layers) + self.mtp_layers * mtp

    @property
    def forward(self) -> float:
        return sum(b.total for b in self.blocks) + self.last_extra


def _mean_min(cap: float, slope: float, seq: int) -> float:
    """Mean over positions p in [0, seq) of min(cap, p * slope): the causal average of a capped count."""
    top = seq * slope
    if top <= 0:
        return 0.0
    if top <= cap:
        return top / 2
    frac = cap / top  # share of positions still on the ramp
    return frac * cap / 2 + (1 - frac) * cap


def core_attention_flops(model: ModelConfig, ratio: int, seq_length: int, windowed: bool = False) -> float:
    """Forward FLOPs per token of core attention (QK^T and AV) in one block (see the module docstring)."""
    nh, d = model.num_attention_heads, model.v_head_dim
    if not is_v4(model):
        keys = _mean_min(model.window_size, 1.0, seq_length) if windowed and model.window_size else seq_length / 2
        if model.attention_variant == "mla":
            return 2 * nh * (model.qk_head_dim + model.qk_pos_emb_head_dim) * keys + 2 * nh * d * keys
        return 4 * nh * model.kv_channels * keys
    win = _mean_min(model.csa_window_size, 1.0, seq_length)
    attn = 4 * nh * d * win
    if ratio:
        cap = model.dsa_indexer_topk if ratio == 4 else float("inf")
        attn += 4 * nh * d * _mean_min(cap, 1.0 / ratio, seq_length)
    if ratio == 4:
        attn += 2 * model.dsa_indexer_heads * model.dsa_indexer_head_dim * (seq_length / (2 * ratio))
    return attn


def up_projection_flops(model: ModelConfig) -> float:
    """Forward FLOPs per token of the up-projections --recompute-modules mla_up_proj repeats: V4's q up-projection,
    MLA's q and kv up-projections; none without MLA."""
    nh = model.num_attention_heads
    if model.attention_variant == "mla":
        dqk, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        return 2.0 * (model.q_lora_rank * nh * (dqk + dr) + model.kv_lora_rank * nh * (dqk + dv))
    if model.attention_variant == "gqa":
        return 0.0
    return 2.0 * model.q_lora_rank * nh * model.v_head_dim


def gemm_shapes(model: ModelConfig, ratio: int, moe: bool) -> tuple[tuple[int, int], ...]:
    """(input, output) widths of the dense projections one token passes through in one block: attention's
    linears (params.mla_params / gqa_params / attention_params), the shared expert or dense MLP (fc1 gated, 2 x
    its width out). The router and the mHC (outputs of E and n^2 + 2n) are left out: not the short-K GEMMs the
    short-K correction is fitted on. Per token each runs 2 x input x output FLOPs forward."""
    h, nh = model.hidden_size, model.num_attention_heads
    rq, rkv = model.q_lora_rank, model.kv_lora_rank
    out: list[tuple[int, int]] = []
    if model.attention_variant == "mla":
        dqk, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        out += [(h, rq), (rq, nh * (dqk + dr))] if rq else [(h, nh * (dqk + dr))]
        out += [(h, rkv + dr), (rkv, nh * (dqk + dv)), (nh * dv, h)]
    elif model.attention_variant == "gqa":
        d, g = model.kv_channels, model.num_query_groups or nh
        out += [(h, nh * d + 2 * g * d), (nh * d, h)]
    else:
        d, og, ol = model.v_head_dim, model.o_groups, model.o_lora_rank
        out += [(h, rq), (rq, nh * d), (h, rkv)]
        out += [(nh * d // og, ol)] * og + [(og * ol, h)]
        if ratio:
            out.append((h, 2 * rkv * (2 if ratio == 4 else 1)))
        if ratio == 4:
            hi, di = model.dsa_indexer_heads, model.dsa_indexer_head_dim
            out += [(rq, hi * di), (h, hi), (h, 2 * di), (h, 2 * di)]
    if moe and model.moe_shared_expert_intermediate_size:
        fs = model.moe_shared_expert_intermediate_size
        out += [(h, 2 * fs), (fs, h)]
    if not moe:
        out += [(h, 2 * model.ffn_hidden_size), (model.ffn_hidden_size, h)]
    return tuple(out)


def block_flops(model: ModelConfig, ratio: int, moe: bool, seq_length: int, windowed: bool = False) -> BlockFlops:
    h = model.hidden_size
    k, pe = model.moe_router_topk, p_expert(model)
    attn = core_attention_flops(model, ratio, seq_length, windowed)
    n = model.hyper_connection_streams
    mhc = 2 * mhc_params(model) + (8 * n * h if n > 1 else 0)
    fs = model.moe_shared_expert_intermediate_size
    shared = 2 * 3 * h * fs if moe else 0.0
    router = 2 * model.num_experts * h if moe else 0.0
    mlp = 0.0 if moe else 2 * 3 * h * model.ffn_hidden_size
    expert = 2 * k * pe if moe else 0.0
    return BlockFlops(
        gemm=2 * attention_params(model, ratio) + mhc + shared + router + mlp,
        expert=expert,
        attn=attn,
        q_up=up_projection_flops(model),
        mhc=mhc,
        shared=shared,
        router=router,
        mlp=mlp,
        act=(4 * (k * model.moe_ffn_hidden_size + fs)) if moe else 4 * model.ffn_hidden_size,
        norm=2 * 4 * h,
    )


def profile(model: ModelConfig, seq_length: int, num_blocks: int | None = None) -> FlopProfile:
    """Per-token forward FLOPs of each block (cached per model, S and block count)."""
    n = model.num_layers if num_blocks is None else num_blocks
    return _profile(model_key(model), int(seq_length), int(n))


@lru_cache(maxsize=256)
def _profile(key: ModelKey, seq: int, n: int) -> FlopProfile:
    m = _Frozen(key)
    blocks = tuple(
        block_flops(m, r, is_moe_block(m, i), seq, is_window_block(m, i)) for i, r in enumerate(block_ratios(m, n))
    )
    depth = int(m.mtp_num_layers or 0)
    return FlopProfile(
        blocks=blocks,
        head=2.0 * m.hidden_size * m.vocab_size,
        mtp_block=block_flops(m, mtp_ratio(m), True, seq) if depth else None,
        mtp_extra=2.0 * 2 * m.hidden_size * m.hidden_size,
        mtp_layers=depth,
    )


def recompute_block(b: BlockFlops, modules: Sequence[str]) -> float:
    """Extra forward FLOPs per token that a --recompute-modules set repeats in one block (recompute.py)."""
    if FULL in modules:
        return b.total
    extra = 0.0
    for piece in repeated(modules):
        extra += getattr(b, piece)
    return extra


def block_costs(
    model: ModelConfig, seq_length: int, num_blocks: int | None = None
) -> tuple[tuple[float, ...], float, float]:
    """Per-block forward FLOPs and the first/last segment extras, for pipeline.split_blocks."""
    n = model.num_layers if num_blocks is None else num_blocks
    return _block_costs(model_key(model), int(seq_length), int(n))


@lru_cache(maxsize=256)
def _block_costs(key: ModelKey, seq: int, n: int) -> tuple[tuple[float, ...], float, float]:
    prof = _profile(key, seq, n)
    costs = tuple(b.total for b in prof.blocks)
    first = EMBEDDING_COST_BLOCKS * (sum(costs) / len(costs) if costs else 0.0)
    return costs, first, prof.last_extra


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one optimizer step of the whole job (all GPUs)."""

    model_flops: float  # 3 x forward x tokens, activated experts only, V4 attention, logits incl. MTP
    recompute_flops: float  # extra forwards of recomputed modules (not in model_flops)
    per_token: float  # model FLOPs per token (3 x forward)
    tokens: int  # B x S
    breakdown: dict[str, float]  # model FLOPs per step by class: gemm, expert, attn, head, mtp


def step_flops(model: ModelConfig, stage: StageConfig, layout: Layout) -> StepFlops:
    """Model and recompute FLOPs per step: tokens = B x S (packed positions; padding not modelled)."""
    n = effective_layers(model, stage)
    fwd, rc, parts = _per_token(model_key(model), stage.seq_length, n, tuple(layout.recompute))
    tokens = stage.global_batch * stage.seq_length
    return StepFlops(
        model_flops=3 * fwd * tokens,
        recompute_flops=rc * tokens,
        per_token=3 * fwd,
        tokens=tokens,
        breakdown={k: 3 * v * tokens for k, v in parts},
    )


@lru_cache(maxsize=1024)
def _per_token(
    key: ModelKey, seq: int, n: int, recompute: tuple[str, ...]
) -> tuple[float, float, tuple[tuple[str, float], ...]]:
    """(forward, recompute forward, ((class, forward), ...)) FLOPs per token."""
    prof = _profile(key, seq, n)
    gemm = sum(b.gemm for b in prof.blocks)
    expert = sum(b.expert for b in prof.blocks)
    attn = sum(b.attn for b in prof.blocks)
    head = prof.head * (1 + prof.mtp_layers)
    mtp = prof.mtp_layers * ((prof.mtp_block.total + prof.mtp_extra) if prof.mtp_block else 0.0)
    rc = sum(recompute_block(b, recompute) for b in prof.blocks)
    if prof.mtp_block:
        rc += prof.mtp_layers * recompute_block(prof.mtp_block, recompute)
    parts = (("gemm", gemm), ("expert", expert), ("attn", attn), ("head", head), ("mtp", mtp))
    return gemm + expert + attn + head + mtp, rc, parts


# A layout's precision (knobs.PRECISIONS) -> the peak its GEMMs run at: fp8 (blockwise, DeepSeek's 128x128) and
# fp8_cs (tensorwise current scaling) at the FP8 peak, mxfp8 (32-element blocks, Blackwell only) at the MXFP8 peak.
PRECISIONS = tuple(knobs.PRECISIONS)
FP8_PRECISIONS = frozenset({"fp8", "fp8_cs", "mxfp8"})


def has_precision(hw: HardwareConfig, precision: str) -> bool:
    """Whether the part has tensor cores for `precision` (MXFP8: a peak_mxfp8_tflops, Blackwell)."""
    return precision in PRECISIONS and (precision != "mxfp8" or bool(hw.peak_mxfp8_tflops))


def peak_tflops(hw: HardwareConfig, precision: str = "bf16") -> float:
    """Dense (no structured sparsity) peak of one GPU at `precision`."""
    if precision in ("fp8", "fp8_cs"):
        return float(hw.peak_fp8_tflops)
    if precision == "mxfp8":
        if not hw.peak_mxfp8_tflops:
            raise ValueError(f"{hw.name} has no MXFP8 tensor cores (peak_mxfp8_tflops unset): use fp8 or bf16")
        return float(hw.peak_mxfp8_tflops)
    if precision in ("bf16", "fp16"):
        return float(hw.peak_bf16_tflops)
    raise ValueError(f"no peak for precision {precision!r} ({', '.join(PRECISIONS)})")


def peak_label(hw: HardwareConfig, precision: str = "bf16") -> str:
    """The denominator named, as the guide asks: hardware, precision, dense (no sparsity)."""
    return f"{hw.name} {precision.upper()} dense peak {peak_tflops(hw, precision):g} TFLOP/s/GPU (no sparsity)"


def mfu(
    flops: StepFlops | float, step_time_s: float, n_gpus: int, hw: HardwareConfig, precision: str = "bf16"
) -> float:
    """Model FLOPs utilization = model FLOPs per step / (step time x N x peak); recompute excluded."""
    f = flops.model_flops if isinstance(flops, StepFlops) else float(flops)
    if step_time_s <= 0 or n_gpus <= 0:
        raise ValueError("step time and GPU count must be positive")
    return f / (step_time_s * n_gpus * peak_tflops(hw, precision) * 1e12)
