"""Parameter counts of a V4-shaped MoE model, per block and in total.

Why: memory (weights, grads, optimizer state) needs *total* parameters per pipeline rank, FLOPs need
*active* parameters per token. The guide's two reference numbers (~1.6T total, ~49B active) are checks
of this model, not inputs to it.

Block structure (Megatron dev `dsv4_hybrid`, names from ModelConfig; h = hidden_size, n_h = heads,
d = v_head_dim = full q/k head dim incl. the rope part, r_q = q_lora_rank, r_kv = kv_lora_rank):
  attention   wq_a h*r_q, q_norm, wq_b r_q*n_h*d; wkv h*r_kv (one shared latent KV), kv_norm;
              grouped low-rank output wo_a n_h*d*o_lora + wo_b o_groups*o_lora*h; per-head sink;
              compressor (ratio 4 or 128): kv+gate projections 2*h*r_kv (x2 for ratio 4: overlapping
              windows) + positional bias + norm; indexer (CSA, ratio 4 only): wq_b r_q*H_i*d_i,
              head weights h*H_i, its own overlapping compressor 4*h*d_i.
  MoE         router E*h (+E expert bias); E routed experts of P_expert = 3*h*f each (SwiGLU, no bias);
              one shared expert 3*h*f_shared.  Dense blocks (the first num_dense_layers) use 3*h*ffn instead.
  norms       2*h (pre-attention, pre-MLP).
  mHC         per sub-layer: phi (n*h) x (n^2 + 2n) + bias (n^2 + 2n) + 3 gates, two sub-layers per block.
  extras      embedding V*h, untied output head V*h + final norm h; each MTP depth: one block
              + eh_proj 2h*h + 3 norms (it shares the embedding and the head with the main model).
Hash-routed layers (moe_n_hash_layers) keep the same parameter shapes; only routing differs.

The GPT path's attention (ModelConfig.attention_variant; Megatron's MLASelfAttention and SelfAttention,
megatron/core/transformer/multi_latent_attention.py, attention.py), d_qk = qk_head_dim, d_r = qk_pos_emb_head_dim:
  mla         q: h*r_q + q_norm r_q + r_q*n_h*(d_qk + d_r) (h*n_h*(d_qk + d_r) without q_lora_rank);
              kv: h*(r_kv + d_r) + kv_norm r_kv + r_kv*n_h*(d_qk + d_v); o: n_h*d_v*h      (DeepSeek-V3)
  gqa         q h*n_h*d, k and v h*g*d each, o n_h*d*h (d = kv_channels, g = num_query_groups), q/k norms 2d,
              with add_bias_linear the qkv and o biases and a learnable softmax sink per head (GPT-OSS)
No mHC (hyper_connection_streams 1), no compressor or indexer; a SwiGLU or GELU-GLU expert is 3hf either way
(+ its fc1/fc2 biases 2f + h with add_bias_linear).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from orchestrator.core.schema import ModelConfig, StageConfig

# Attention symbols of Megatron dev's hybrid pattern, keyed by CSA compress ratio.
RATIO_SYMBOL = {4: "C", 128: "H", 0: "W"}


V4_ATTENTION = "dsv4_hybrid"  # ModelConfig.attention_variant of Megatron dev's DeepSeek-V4 path


def is_v4(model: ModelConfig) -> bool:
    """The model trains on the V4 hybrid path (CSA/HCA attention, mHC, the '|' pattern): the V4 rules apply."""
    return model.attention_variant == V4_ATTENTION


def p_expert(model: ModelConfig) -> int:
    """One gated routed expert: P_expert = 3 h f (66,060,288 for V4-Pro), + 2f + h biases with add_bias_linear."""
    h, f = model.hidden_size, model.moe_ffn_hidden_size
    return 3 * h * f + ((2 * f + h) if model.add_bias_linear else 0)


def effective_layers(model: ModelConfig, stage: StageConfig | None = None) -> int:
    """Decoder blocks actually built: a slice stage overrides the count, keeping h and E."""
    override = getattr(stage, "num_layers_override", None) if stage is not None else None
    return int(override) if override else int(model.num_layers)


def block_ratios(model: ModelConfig, num_blocks: int | None = None) -> tuple[int, ...]:
    """CSA compress ratio of each decoder block (entry i of csa_compress_ratios; the last entry repeats); 0 for
    every block of a GPT-path model, which has no compressed attention."""
    n = model.num_layers if num_blocks is None else num_blocks
    if not is_v4(model):
        return (0,) * n
    r = list(model.csa_compress_ratios) or [0]
    return tuple(r[i] if i < len(r) else r[-1] for i in range(n))


def mtp_ratio(model: ModelConfig) -> int:
    """CSA ratio of the MTP block: the entry right after the model's num_layers (all depths share it,
    because Megatron requires identical MTP sub-patterns); 0 off the V4 path."""
    if not is_v4(model):
        return 0
    r = list(model.csa_compress_ratios) or [0]
    return r[model.num_layers] if model.num_layers < len(r) else r[-1]


def d_window(model: ModelConfig) -> int:
    """Rows each CP rank must hold for the CSA boundary exchange: max(csa_window_size, 8 for ratio-4
    layers, else the ratio)."""
    ratios = [8 if r == 4 else r for r in (model.csa_compress_ratios or [])]
    return max([model.csa_window_size, *ratios])


def is_moe_block(model: ModelConfig, i: int) -> bool:
    return i >= model.num_dense_layers


def is_window_block(model: ModelConfig, i: int) -> bool:
    """Block i (0-based) attends a sliding window: Megatron windows every layer but each window_attn_skip_freq-th
    (1-based layer_number % freq == 0 attends fully: megatron/core/transformer/utils.py is_layer_window_attention
    in 0.19.2). Never on the V4 path, whose window is part of CSA/HCA."""
    if is_v4(model) or not model.window_size:
        return False
    freq = model.window_attn_skip_freq
    return not (freq and (i + 1) % freq == 0)


@dataclass(frozen=True)
class BlockCounts:
    """Parameters of one Transformer block, split the way memory and sharding need them."""

    ratio: int
    attention: int  # MLA/V4 projections, compressor, indexer, q/kv norms, sinks
    router: int
    routed_experts: int  # E x P_expert (0 for a dense block)
    shared_expert: int
    dense_mlp: int  # only for the leading dense blocks
    norms: int
    mhc: int
    active_routed: int  # k x P_expert (0 for a dense block)

    @property
    def dense(self) -> int:
        """Everything replicated over D_a (all but the routed experts)."""
        return self.attention + self.router + self.shared_expert + self.dense_mlp + self.norms + self.mhc

    @property
    def total(self) -> int:
        return self.dense + self.routed_experts

    @property
    def active(self) -> int:
        """Parameters one token touches in this block: k routed + shared + everything dense."""
        return self.dense + self.active_routed


@dataclass(frozen=True)
class ParamCounts:
    """Whole-model parameter counts. `blocks` are the decoder blocks, `mtp_block` one MTP depth's block."""

    p_expert: int
    blocks: tuple[BlockCounts, ...]
    mtp_block: BlockCounts | None
    embedding: int
    output_head: int  # untied head + final norm
    mtp: int  # per MTP depth: its block + eh_proj + norms (embedding/head shared)
    mtp_layers: int
    total: int
    active: int  # per token, incl. embedding row, head and MTP

    @property
    def attention(self) -> int:
        return sum(b.attention for b in self.blocks)

    @property
    def routed_experts(self) -> int:
        return sum(b.routed_experts for b in self.blocks)

    @property
    def shared_expert(self) -> int:
        return sum(b.shared_expert for b in self.blocks)

    @property
    def router(self) -> int:
        return sum(b.router for b in self.blocks)

    @property
    def norms(self) -> int:
        return sum(b.norms for b in self.blocks)

    @property
    def mhc(self) -> int:
        return sum(b.mhc for b in self.blocks)


def mla_params(model: ModelConfig) -> int:
    """Megatron's MLA (DeepSeek-V3): low-rank q and kv projections, a shared rope key, the output projection."""
    h, nh = model.hidden_size, model.num_attention_heads
    dqk, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    rq, rkv = model.q_lora_rank, model.kv_lora_rank
    q = (h * rq + rq + rq * nh * (dqk + dr)) if rq else h * nh * (dqk + dr)
    kv = h * (rkv + dr) + rkv + rkv * nh * (dqk + dv)
    return q + kv + nh * dv * h


def gqa_params(model: ModelConfig) -> int:
    """Grouped-query attention (Qwen3, GPT-OSS): q, k, v, o projections, q/k norms, biases and sinks."""
    h, nh, d = model.hidden_size, model.num_attention_heads, model.kv_channels
    g = model.num_query_groups or nh
    out = h * nh * d + 2 * h * g * d + nh * d * h
    if model.qk_layernorm:
        out += 2 * d
    if model.add_bias_linear:  # qkv bias, o bias, and GPT-OSS's learnable softmax offset per head
        out += (nh + 2 * g) * d + h + nh
    return out


def kv_elems(model: ModelConfig) -> int:
    """Key + value elements per token one GPT-path attention layer builds (what ring CP passes round)."""
    nh = model.num_attention_heads
    if model.attention_variant == "mla":
        return nh * (model.qk_head_dim + model.qk_pos_emb_head_dim) + nh * model.v_head_dim
    return 2 * (model.num_query_groups or nh) * model.kv_channels


def attention_params(model: ModelConfig, ratio: int) -> int:
    """Attention of one block: V4's with CSA ratio 4 (CSA), 128 (HCA) or 0 (window only), or the GPT path's."""
    if model.attention_variant == "mla":
        return mla_params(model)
    if model.attention_variant == "gqa":
        return gqa_params(model)
    if ratio not in RATIO_SYMBOL:
        raise ValueError(f"csa compress ratio {ratio} not in {sorted(RATIO_SYMBOL)}")
    h, nh, d = model.hidden_size, model.num_attention_heads, model.v_head_dim
    rq, rkv = model.q_lora_rank, model.kv_lora_rank
    q = h * rq + rq + rq * nh * d
    kv = h * rkv + rkv
    o = nh * d * model.o_lora_rank + model.o_groups * model.o_lora_rank * h
    sinks = nh
    comp = idx = 0
    if ratio:
        width = 2 if ratio == 4 else 1  # ratio-4 compression uses overlapping windows
        comp = 2 * h * rkv * width + ratio * rkv * width + rkv
    if ratio == 4:
        hi, di = model.dsa_indexer_heads, model.dsa_indexer_head_dim
        idx = rq * hi * di + h * hi + 2 * h * di * 2 + ratio * di * 2 + di
    return q + kv + o + sinks + comp + idx


def mhc_params(model: ModelConfig) -> int:
    """Manifold-constrained hyper-connections of one block (two sub-layers)."""
    n, h = model.hyper_connection_streams, model.hidden_size
    if n <= 1:
        return 0
    per = (n * h) * (n * n + 2 * n) + (n * n + 2 * n) + 3
    return 2 * per


def block_counts(model: ModelConfig, ratio: int, moe: bool) -> BlockCounts:
    h = model.hidden_size
    pe = p_expert(model)
    return BlockCounts(
        ratio=ratio,
        attention=attention_params(model, ratio),
        router=(model.num_experts * h + model.num_experts) if moe else 0,
        routed_experts=model.num_experts * pe if moe else 0,
        shared_expert=3 * h * model.moe_shared_expert_intermediate_size if moe else 0,
        dense_mlp=0
        if moe
        else 3 * h * model.ffn_hidden_size + ((2 * model.ffn_hidden_size + h) if model.add_bias_linear else 0),
        norms=2 * h,
        mhc=mhc_params(model),
        active_routed=model.moe_router_topk * pe if moe else 0,
    )


def param_counts(model: ModelConfig, num_blocks: int | None = None) -> ParamCounts:
    """Count every parameter of the model (num_blocks: a slice's decoder block count)."""
    return _param_counts(model_key(model), model.num_layers if num_blocks is None else num_blocks)


@lru_cache(maxsize=64)
def _param_counts(key: ModelKey, num_blocks: int) -> ParamCounts:
    model = _Frozen(key)
    h, v = model.hidden_size, model.vocab_size
    ratios = block_ratios(model, num_blocks)
    blocks = tuple(block_counts(model, r, is_moe_block(model, i)) for i, r in enumerate(ratios))
    n_mtp = int(model.mtp_num_layers or 0)
    mtp_block = block_counts(model, mtp_ratio(model), True) if n_mtp else None
    embedding = v * h
    head = v * h + h
    mtp = (mtp_block.total + 2 * h * h + 3 * h) if mtp_block else 0
    total = embedding + head + sum(b.total for b in blocks) + n_mtp * mtp
    mtp_active = (mtp_block.active + 2 * h * h + 3 * h) if mtp_block else 0
    # Like the model cards (V3's 37B adds up only with them), count embedding and head as activated.
    active = embedding + head + sum(b.active for b in blocks) + n_mtp * mtp_active
    return ParamCounts(
        p_expert=p_expert(model),
        blocks=blocks,
        mtp_block=mtp_block,
        embedding=embedding,
        output_head=head,
        mtp=mtp,
        mtp_layers=n_mtp,
        total=total,
        active=active,
    )


# --- hashable model key (ModelConfig is a mutable dataclass, so it cannot key a cache itself) ----------


class ModelKey(tuple[tuple[str, Any], ...]):
    """A model_key tuple whose hash is computed once (tuples re-hash their items on every lookup)."""

    def __hash__(self) -> int:  # noqa: D105
        h = self.__dict__.get("_h")
        if h is None:
            h = self.__dict__["_h"] = tuple.__hash__(self)
        return h


_KEYS: dict[int, tuple[dict[str, Any], ModelKey]] = {}  # id(model) -> (snapshot of its fields, ModelKey)


def model_key(model: ModelConfig) -> ModelKey:
    """A hashable snapshot of a ModelConfig (lists become tuples).

    Memoized on the object's identity and re-validated against a copy of its fields, so an in-place
    edit of the model is seen, while the planner's 20k calls with one model cost a dict compare each.
    """
    if isinstance(model, _Frozen):
        return model.key
    fields = vars(model)
    hit = _KEYS.get(id(model))
    if hit is not None and hit[0] == fields:
        return hit[1]
    key = ModelKey((k, tuple(v) if isinstance(v, list) else v) for k, v in fields.items())
    if len(_KEYS) > 256:
        _KEYS.clear()
    _KEYS[id(model)] = ({k: list(v) if isinstance(v, list) else v for k, v in fields.items()}, key)
    return key


class _Frozen(ModelConfig):
    """Read-only attribute view of a model_key, so cached functions can use the real field names (list
    fields are tuples here). A ModelConfig to the type checker; its own __init__ copies the key."""

    key: ModelKey

    def __init__(self, key: ModelKey) -> None:  # not the dataclass __init__: a snapshot, not a config
        self.__dict__.update(key)
        self.__dict__["key"] = key
