"""What the simulated machine runs: the model's blocks as the job's layer pattern places them, and what one
token costs in each block (parameters, forward FLOPs, stored activation bytes by component).

Why its own counts: the truth must not share a formula with the planner it judges (orchestrator/plan/), so
it counts the same Megatron tensors its own, coarser way. The pattern is the job's `--hybrid-layer-pattern`
(Megatron dev's symbols, megatron/core/models/hybrid/hybrid_layer_allocation.py:14-27 at d48bd6be0a85: per
block C = CSA (compress ratio 4, with the sparse indexer), H = HCA (ratio 128), W = window only, * or D =
full attention; then E = MoE or - = dense MLP; '|' between pipeline segments, '/' before each MTP depth);
without one, the blocks are split evenly from the model's compress ratios.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from orchestrator.core.schema import ModelConfig

RATIO_OF = {"C": 4, "H": 128, "W": 0, "*": 1, "D": 1}  # attention symbol -> compress ratio (1: none)
SYMBOL_OF = {4: "C", 128: "H", 0: "W"}
ACT_GROUPS = ("attn", "moe", "mhc", "norm")  # activation components a surface can mis-size on its own
# What each --recompute-modules entry stops storing (its tensors are rebuilt in backward instead).
RECOMPUTE_FREES = {
    "mla_up_proj": ("q_up",),
    "mhc": ("mhc",),
    "layernorm": ("norm",),
    "moe_act": ("moe_act",),
    "moe": ("moe_in", "moe_fc1", "moe_act", "moe_fc2", "router", "shared"),
    "shared_experts": ("shared",),
    "mlp": ("mlp",),
    "core_attn": ("core",),
}
OFFLOAD_FREES = {
    "attn_norm": ("norm",),
    "qkv_linear": ("q_up", "kv"),
    "core_attn": ("core",),
    "attn_proj": ("o_lora",),
    "mlp_norm": ("norm",),
    "expert_fc1": ("moe_fc1",),
    "moe_act": ("moe_act",),
    "fused_group_mlp": ("moe_fc1", "moe_act", "moe_fc2"),
}
TENSOR_GROUP = {  # stored tensor -> activation component
    "q_down": "attn",
    "q_up": "attn",
    "kv": "attn",
    "core": "attn",
    "o_lora": "attn",
    "indexer": "attn",
    "router": "moe",
    "moe_in": "moe",
    "moe_fc1": "moe",
    "moe_act": "moe",
    "moe_fc2": "moe",
    "shared": "moe",
    "mlp": "moe",
    "mhc": "mhc",
    "norm": "norm",
}


@dataclass(frozen=True)
class Block:
    """One decoder (or MTP) block as the machine sees it: per token of one microbatch."""

    symbol: str  # C | H | W
    moe: bool
    dense_params: float  # attention, norms, mixing, router, shared expert (or dense MLP)
    expert_params: float  # every routed expert of the block
    gemm_flops: float  # forward FLOPs per token in dense GEMMs
    attn_flops: float  # forward FLOPs per token in the attention kernel (scores + values, indexer)
    expert_flops: float  # forward FLOPs per token in routed experts (k of them)
    tensors: tuple[tuple[str, float], ...]  # stored activation elements per token, by tensor


@dataclass(frozen=True)
class Shape:
    """The model as the job builds it: blocks per pipeline segment, MTP blocks, the extras."""

    segments: tuple[tuple[Block, ...], ...]  # segment i runs on PP rank i % PP
    mtp: tuple[Block, ...]  # on the last PP rank
    embedding_params: float
    head_params: float
    head_flops: float  # forward FLOPs per token of the output head (per head: main + each MTP depth)
    _kinds: dict = field(default_factory=dict, compare=False, repr=False)  # (rank, pp) -> rank_kinds

    def rank_kinds(self, rank: int, pp: int) -> tuple[tuple[Block, int], ...]:
        """The blocks PP rank `rank` runs (its segments, and the MTP blocks on the last rank), as
        (block kind, count): a rank holds tens of blocks of a few kinds."""
        if (rank, pp) in self._kinds:
            return self._kinds[rank, pp]
        counts: dict[int, list] = {}
        blocks = [b for seg in self.segments[rank::pp] for b in seg] + (list(self.mtp) if rank == pp - 1 else [])
        for b in blocks:
            counts.setdefault(id(b), [b, 0])[1] += 1
        out = self._kinds[rank, pp] = tuple((b, n) for b, n in counts.values())
        return out


def _ratios(model: ModelConfig, n: int) -> list[int]:
    r = list(model.csa_compress_ratios) or [0]
    return [r[i] if i < len(r) else r[-1] for i in range(n + 1)]  # entry n: the MTP block's


def _block(model: ModelConfig, symbol: str, moe: bool, seq: int) -> Block:
    h, nh, d, dv = model.hidden_size, model.num_attention_heads, model.kv_channels, model.v_head_dim
    rq, rkv, k, f = model.q_lora_rank, model.kv_lora_rank, model.moe_router_topk, model.moe_ffn_hidden_size
    e, fs, n = model.num_experts, model.moe_shared_expert_intermediate_size, max(1, model.hyper_connection_streams)
    ratio = RATIO_OF[symbol]
    attn_p = h * rq + rq * nh * d + h * (rkv + model.qk_pos_emb_head_dim) + nh * dv * model.o_lora_rank
    attn_p += model.o_groups * model.o_lora_rank * h + (2 * h * rkv if ratio else 0)
    if ratio == 4:
        attn_p += rq * model.dsa_indexer_heads * model.dsa_indexer_head_dim + 4 * h * model.dsa_indexer_head_dim
    mix_p = 2 * n * h * (n + 2) if n > 1 else 0
    ffn_p = (e * h + 3 * h * fs) if moe else 3 * h * model.ffn_hidden_size
    # attended keys per query, causal on average: the window, plus the compressed (or indexer-picked) past
    window = min(model.csa_window_size, seq)
    if ratio == 4:
        keys = window + min(model.dsa_indexer_topk, seq / (2 * ratio))
        index = 2.0 * model.dsa_indexer_heads * model.dsa_indexer_head_dim * seq / (2 * ratio)
    else:
        keys, index = window + (seq / (2 * ratio) if ratio else 0.0), 0.0
    tensors = {
        "q_down": 2 * rq,
        "q_up": nh * d,
        "kv": rkv * (3 if ratio else 1),
        "core": nh * dv + 4 * nh,
        "o_lora": nh * dv * model.o_lora_rank / max(1, model.o_groups * model.o_lora_rank) + model.o_lora_rank,
        "indexer": model.dsa_indexer_heads * model.dsa_indexer_head_dim + 2 * model.dsa_indexer_topk
        if ratio == 4
        else 0,
        "mhc": 3 * n * h if n > 1 else h,
        "norm": 2 * h,
    }
    if moe:
        tensors.update(router=2 * e, moe_in=k * h, moe_fc1=2 * k * f, moe_act=k * f, moe_fc2=k * h, shared=4 * fs)
    else:
        tensors["mlp"] = 4 * model.ffn_hidden_size
    return Block(
        symbol=symbol,
        moe=moe,
        dense_params=float(attn_p + mix_p + ffn_p + 2 * h),
        expert_params=float(e * 3 * h * f) if moe else 0.0,
        gemm_flops=2.0 * (attn_p + mix_p + ffn_p),
        attn_flops=2.0 * nh * (d + dv) * keys + index,
        expert_flops=2.0 * k * 3 * h * f if moe else 0.0,
        tensors=tuple((name, float(v)) for name, v in tensors.items() if v),
    )


def shape(model: ModelConfig, seq: int, pattern: str, pp: int, vpp: int, blocks: int) -> Shape:
    """The model's blocks for one job: from its layer pattern, else an even split of `blocks` over PP x VPP."""
    return _shape(_model_key(model), seq, pattern, pp, vpp, blocks)


def _model_key(model: ModelConfig) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(vars(model).items()))


@lru_cache(maxsize=256)
def _shape(key: tuple, seq: int, pattern: str, pp: int, vpp: int, blocks: int) -> Shape:
    fields: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in key}
    model = ModelConfig(**fields)
    ratios = _ratios(model, blocks)
    made: dict[tuple[str, bool], Block] = {}  # one object per kind: the machine memoises on identity

    def block(symbol: str, moe: bool) -> Block:
        if (symbol, moe) not in made:
            made[symbol, moe] = _block(model, symbol, moe, seq)
        return made[symbol, moe]

    if pattern and pattern.split("/")[0]:
        main, *mtp_parts = pattern.split("/")
        segs = [_parse(s, block) for s in main.split("|")]
        mtp = tuple(b for part in mtp_parts for b in _parse(part, block))
    else:
        syms = [(SYMBOL_OF.get(r, "W"), i >= model.num_dense_layers) for i, r in enumerate(ratios[:blocks])]
        n_seg = max(1, pp * vpp)
        cuts = [round(i * blocks / n_seg) for i in range(n_seg + 1)]
        segs = [tuple(block(s, m) for s, m in syms[a:b]) for a, b in itertools.pairwise(cuts)]
        mtp = tuple(block(SYMBOL_OF.get(ratios[blocks], "W"), True) for _ in range(model.mtp_num_layers))
    h, v = model.hidden_size, model.vocab_size
    return Shape(
        segments=tuple(tuple(s) for s in segs),
        mtp=mtp,
        embedding_params=float(v * h),
        head_params=float(v * h + (2 * h * h) * len(mtp)),
        head_flops=2.0 * h * v,
    )


def _parse(text: str, block) -> tuple[Block, ...]:
    """Blocks of one pattern piece: an attention symbol, then E (MoE) or - (dense MLP)."""
    return tuple(block(ch, text[i + 1 : i + 2] != "-") for i, ch in enumerate(text) if ch in RATIO_OF)
