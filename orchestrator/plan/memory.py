"""Peak memory of every pipeline rank, in decimal GB, from the guide's decomposition

    M_peak = M_weight + M_grad + M_optimizer + M_activation + M_communication + M_workspace + M_runtime.

Why per rank: 61 blocks split unevenly, embedding sits on rank 0, output head + MTP (+ an embedding
copy for MTP) on the last rank, and 1F1B keeps more microbatches alive on early ranks, so the heaviest
rank decides feasibility: heaviest.total + stage.memory_margin_gb <= hw.hbm_gb.

Per GPU of PP rank r (blocks from its segments r, r+PP, ...):
  weights     BF16, 2 B/param: routed experts / (EP x ETP); everything else / TP
  grads       FP32 main grads, 4 B/param, not sharded (the distributed optimizer is ZeRO-1); 2 B with the recipe's
              --grad-reduce-in-bf16 (a BF16 grad buffer, RecipeConfig.grad_reduce_in_bf16)
  optimizer   FP32 master + moments: Adam 12 B/param; Muon 8 B/param for matrices (embedding and head
              use Adam, Megatron's scalar optimizer). A layout's precision-aware optimizer (its `optim` knob,
              optimizer_bytes: Adam with the distributed optimizer) keeps its main grads and moments in their
              dtypes: BF16 both (dev's V4 recipe) = 2 B grads and 4 + 2 + 2 = 8 B of state per param.
              With --use-distributed-optimizer dense state is
              sharded over D_a x CP (Megatron's data-parallel-with-CP group: CP ranks hold the same
              dense weights) and expert state over D_e.
  activations per token per block (elements, BF16): block input n h (n = mHC streams), mHC mid streams,
              norms, MLA/V4 projections (q up n_h d dominates), compressor/indexer, core attention
              output, MoE dispatch/expert tensors (x hot-rank routing skew; not the expert output,
              NOT_SAVED), shared expert.
              A --recompute-modules set drops its modules' tensors; "full" keeps the input of every
              layer, and a block is two hybrid layers (attention symbol, MoE symbol), so two n h inputs
              per block (recompute.FULL_INPUTS_PER_BLOCK), plus one block's working set;
              --offload-modules drops the offloaded tensors.
              An FP8 stage keeps its FP8 linear layers' inputs in FP8 (FP8_SAVED: 1 B each).
              Tokens per microbatch and GPU: b S / CP, divided by TP (sequence parallel).
              In flight on rank r: 1F1B min(m, PP - r) microbatches; interleaved (VPP v)
              min(m v, 2 (PP - r - 1) + (v - 1) PP + 1) chunks of ~1/v of the rank's blocks.
              The last rank also holds one microbatch of logits: b S / CP x V / TP x 4 B x (1 + mtp).
  communication  dispatch + combine receive buffers of one MoE layer, sized for the hottest rank
              (moe.hot_rank_factor), or the whole group's tokens for the allgather dispatcher;
              flex dispatchers add registered (NVSHMEM/RDMA) buffers.
  workspace, runtime  from HardwareConfig.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from orchestrator.core.knobs import OPTIM_DTYPES
from orchestrator.core.schema import HardwareConfig, ModelConfig, RecipeConfig, StageConfig
from orchestrator.plan import moe as moe_model
from orchestrator.plan import pipeline
from orchestrator.plan.flops import FP8_PRECISIONS
from orchestrator.plan.layout import Groups, Layout
from orchestrator.plan.params import ModelKey, _Frozen, block_ratios, is_moe_block, model_key, param_counts
from orchestrator.plan.pipeline import checked_split, cumulative
from orchestrator.plan.recompute import FULL, FULL_INPUTS_PER_BLOCK, dropped

GB = 1e9
WEIGHT_BYTES = 2
GRAD_BYTES = 4
ADAM_BYTES = 12
MUON_BYTES = 8
MASTER_BYTES = 4  # FP32 master weights (--main-params-dtype fp32, Megatron's default)
# bytes of the dtypes --main-grads-dtype / --main-params-dtype / --exp-avg-dtype take (dev
# megatron/training/arguments.py:5111-5139)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
ACT_BYTES = 2
LOGIT_BYTES = 4
FLEX_BUFFER_GB = 1.0  # DeepEP / HybridEP / NCCL-EP registered buffers (order of magnitude)
DEFAULT_ROUTING_SIGMA = 0.25  # lognormal sigma of per-expert load once the router settles (a prior)

EXPERT_TENSORS = frozenset(("moe_input", "expert_fc1", "moe_act", "expert_fc2"))
# Written by a block but saved for backward by no op: Megatron applies the routing probabilities inside the
# experts' activation (megatron-core 0.19.2 megatron/core/transformer/moe/experts.py:807-833, weighted SwiGLU /
# GEGLU with permuted_probs) and unpermutes the expert output without them (token_dispatcher.py:884-891), so the
# fc2 output's only consumer is a permutation that keeps nothing. steptime's memory-bound passes still count it.
NOT_SAVED = frozenset(("expert_fc2",))
# Kept in FP8 (1 B, not 2) by an FP8 stage: the inputs of FP8 linear layers, which Transformer Engine saves for
# the weight gradient already quantized: "Stores linear layer inputs in FP8 instead of BF16" (megatron-core dev
# d48bd6be megatron/core/transformer/moe/README.md:459). The attention norm's output (input of the fused norm +
# QKV or q/kv-down projection), the experts' fc1 input (the permuted tokens) and fc2 input (the activation
# output). Not the pre-MLP norm's output (the router, a BF16/FP32 linear, reads it), nor what attention kernels,
# norms or activation functions save (BF16). steptime's memory-bound passes are unchanged.
FP8_SAVED = frozenset(("attn_norm", "moe_input", "moe_act"))
FP8_BYTES = 1
# The terms calibration scales separately (orchestrator/search/calibrate.py): model states (weights, grads,
# optimizer: exact byte counts), activations (the analytic estimate most often wrong, 2-3x), buffers
# (dispatch receive buffers, workspace, runtime: allocator- and library-dependent).
TERMS = ("states", "activations", "buffers")
# one factor for every term, or one per term (missing: 1), plus optional per-recompute-set activation
# multipliers keyed f"activations@{recompute_key(...)}" (each set keeps different tensors, so its estimate errs
# differently; "activations@*" for a set with no multiplier of its own)
MemoryScale = float | Mapping[str, float]


@dataclass(slots=True)
class StageMemory:
    """Peak memory of one GPU on PP rank `stage`, decimal GB."""

    stage: int
    blocks: int
    moe_blocks: int
    routed_weights: float
    dense_weights: float  # attention + shared + norms + router + mHC (+ dense MLP)
    embedding: float
    head: float
    mtp: float  # MTP block + eh_proj weights (routed part included)
    grads: float
    optimizer: float
    activations: float
    dispatch_buffers: float
    workspace: float
    runtime: float

    @property
    def weights(self) -> float:
        return self.routed_weights + self.dense_weights + self.embedding + self.head + self.mtp

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.grads
            + self.optimizer
            + self.activations
            + self.dispatch_buffers
            + self.workspace
            + self.runtime
        )

    def terms(self) -> dict[str, float]:
        """The total split into the calibrated TERMS (they sum to `total`)."""
        return {
            "states": self.weights + self.grads + self.optimizer,
            "activations": self.activations,
            "buffers": self.dispatch_buffers + self.workspace + self.runtime,
        }

    def scaled(self, scale: MemoryScale, recompute: Sequence[str] = ()) -> float:
        """The total with each term multiplied by its calibration factor (a float scales all alike)."""
        if not isinstance(scale, Mapping):
            return self.total * scale
        return scaled_terms(self.terms(), scale, recompute)

    def breakdown(self) -> dict[str, float]:
        return {
            "routed_weights": self.routed_weights,
            "dense_weights": self.dense_weights,
            "embedding": self.embedding,
            "head": self.head,
            "mtp": self.mtp,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "dispatch_buffers": self.dispatch_buffers,
            "workspace": self.workspace,
            "runtime": self.runtime,
        }


def _attention_elems(model: ModelConfig, ratio: int) -> dict[str, int]:
    """The attention tensors of one block kept for backward, per token. On the GPT path: MLA keeps the q and kv
    latents (q_down, kv) and the up-projected q, k, v ("q_up": what mla_up_proj recomputes); GQA its q ("q_up")
    and k, v ("kv"); both the core-attention output with its FP32 log-sum-exp, no compressor or indexer."""
    nh, d = model.num_attention_heads, model.v_head_dim
    rq, rkv = model.q_lora_rank, model.kv_lora_rank
    if model.attention_variant == "mla":
        dqk, dr = model.qk_head_dim, model.qk_pos_emb_head_dim
        return {
            "q_down": 2 * rq,
            "q_up": nh * (dqk + dr) + nh * (dqk + d),
            "kv": 2 * rkv + dr,
            "indexer": 0,
            "core_attn": nh * d + 2 * nh,
            "attn_proj": 0,
        }
    if model.attention_variant == "gqa":
        kv = model.kv_channels
        return {
            "q_down": 0,
            "q_up": nh * kv,
            "kv": 2 * (model.num_query_groups or nh) * kv,
            "indexer": 0,
            "core_attn": nh * kv + 2 * nh,
            "attn_proj": 0,
        }
    comp = (2 * rkv * (2 if ratio == 4 else 1)) if ratio else 0
    return {
        "q_down": 2 * rq,
        "q_up": nh * d,
        "kv": 2 * rkv + comp,
        "indexer": (model.dsa_indexer_heads * (model.dsa_indexer_head_dim + 1) + 4 * model.dsa_indexer_head_dim)
        if ratio == 4
        else 0,
        "core_attn": nh * d + 2 * nh,  # output + fp32 log-sum-exp
        "attn_proj": model.o_groups * model.o_lora_rank,
    }


def block_activation_elems(model: ModelConfig, ratio: int, moe: bool) -> dict[str, int]:
    """Activation elements stored per token for backward in one block, by tensor (no recompute)."""
    h = model.hidden_size
    n = max(1, model.hyper_connection_streams)
    t = {
        "input": n * h,
        "mhc": (n * h + 2 * h) if n > 1 else 0,
        "attn_norm": h,
        **_attention_elems(model, ratio),
        "mlp_norm": h,
    }
    if moe:
        k, f, fs = model.moe_router_topk, model.moe_ffn_hidden_size, model.moe_shared_expert_intermediate_size
        t.update(
            router=2 * model.num_experts,
            moe_input=k * h,
            expert_fc1=2 * k * f,
            moe_act=k * f,
            expert_fc2=k * h,
            shared=3 * fs,
        )
    else:
        t["mlp"] = 3 * model.ffn_hidden_size
    return t


def _kept(
    tensors: dict[str, int], recompute: tuple[str, ...], offload: tuple[str, ...], fp8: bool = False
) -> tuple[float, float, float]:
    """(dense elems, expert elems, full working elems) per token after recompute and offload (recompute.py), in
    BF16-element equivalents: an FP8 stage's FP8_SAVED tensors count FP8_BYTES / ACT_BYTES each."""
    full = float(sum(tensors.values()))
    if FULL in recompute:
        return float(tensors["input"] * FULL_INPUTS_PER_BLOCK), 0.0, full
    drop = dropped(recompute, offload) | NOT_SAVED
    w = {k: (FP8_BYTES / ACT_BYTES if fp8 and k in FP8_SAVED else 1.0) for k in tensors}
    dense = sum(v * w[k] for k, v in tensors.items() if k not in drop and k not in EXPERT_TENSORS)
    expert = sum(v * w[k] for k, v in tensors.items() if k not in drop and k in EXPERT_TENSORS)
    return float(dense), float(expert), 0.0


def offloaded_elems(
    model: ModelConfig, ratio: int, moe: bool, recompute: tuple[str, ...], offload: tuple[str, ...], fp8: bool = False
) -> tuple[float, float]:
    """(dense, expert) BF16-element equivalents per token that one block's --offload-modules send to the host:
    what the block keeps under its recompute set alone less what it keeps with the offload too (_kept, the one
    accounting), so a tensor recompute already drops, or one no op saves, moves nothing. steptime times the copies."""
    if not offload:
        return 0.0, 0.0
    t = block_activation_elems(model, ratio, moe)
    d0, e0, _ = _kept(t, recompute, (), fp8)
    d1, e1, _ = _kept(t, recompute, offload, fp8)
    return d0 - d1, e0 - e1


@dataclass(frozen=True, eq=False)
class _Prefix:
    """Prefix sums over decoder blocks, so per-rank sums cost O(segments) per candidate."""

    dense_params: tuple[float, ...]
    routed_params: tuple[float, ...]
    act_dense: tuple[float, ...]
    act_expert: tuple[float, ...]
    blocks: tuple[int, ...]
    moe: tuple[int, ...]
    working: float  # largest block's full activation elements per token (full recompute)
    mtp_act: tuple[float, float]  # (dense, expert) of one MTP depth


@lru_cache(maxsize=512)
def _prefix(key: ModelKey, n: int, recompute: tuple[str, ...], offload: tuple[str, ...], fp8: bool = False) -> _Prefix:
    m = _Frozen(key)
    pc = param_counts(m, n)
    kept, working = [], 0.0
    for i, r in enumerate(block_ratios(m, n)):
        t = block_activation_elems(m, r, is_moe_block(m, i))
        kept.append(_kept(t, recompute, offload, fp8))
        working = max(working, float(sum(t.values())) if FULL in recompute else 0.0)
    mtp = (0.0, 0.0)
    if pc.mtp_block is not None:
        kd, ke, _ = _kept(block_activation_elems(m, pc.mtp_block.ratio, True), recompute, offload, fp8)
        mtp = (kd, ke)
    return _Prefix(
        dense_params=cumulative(b.dense for b in pc.blocks),
        routed_params=cumulative(b.routed_experts for b in pc.blocks),
        act_dense=cumulative(k[0] for k in kept),
        act_expert=cumulative(k[1] for k in kept),
        blocks=cumulative(1 for _ in pc.blocks),
        moe=cumulative(1 if b.routed_experts else 0 for b in pc.blocks),
        working=working,
        mtp_act=mtp,
    )


@lru_cache(maxsize=4096)
def _rank_sums(px: _Prefix, bps: tuple[int, ...], pp: int, vpp: int) -> tuple[tuple[float, ...], ...]:
    """Per PP rank: (dense params, routed params, dense act elems, expert act elems, blocks, MoE blocks)
    over its segments. Cached: a planner sees few distinct splits."""
    return pipeline.rank_sums(
        (px.dense_params, px.routed_params, px.act_dense, px.act_expert, px.blocks, px.moe), bps, pp, vpp
    )


def in_flight(rank: int, pp: int, vpp: int, m: int) -> float:
    """Microbatch-equivalents of activations alive on PP rank `rank` at its peak (see module doc)."""
    if pp <= 1:
        return 1.0
    if vpp <= 1:
        return float(min(m, pp - rank))
    chunks = min(m * vpp, 2 * (pp - rank - 1) + (vpp - 1) * pp + 1)
    return chunks / vpp


def precision_aware(model: ModelConfig, stage: StageConfig, optim: str = "fp32") -> bool:
    """Whether the layout's optimizer precision (knobs.OPTIM_DTYPES) runs Megatron's precision-aware optimizer:
    a name other than "fp32" where Megatron builds one, Adam with the distributed optimizer (dev
    megatron/core/optimizer/optimizer_config.py:519-525 asserts both; rules.py rejects the rest). argv emits
    the flags exactly when this is true."""
    if optim not in OPTIM_DTYPES:
        raise ValueError(f"optimizer precision {optim!r}: one of {', '.join(OPTIM_DTYPES)}")
    return optim != "fp32" and str(model.optimizer).lower() == "adam" and bool(stage.use_distributed_optimizer)


def optimizer_bytes(
    model: ModelConfig, stage: StageConfig, optim: str = "fp32", grad_reduce_bf16: bool = False
) -> tuple[int, int]:
    """(main-grad bytes, optimizer-state bytes) per parameter: FP32 grads and Adam's 12 B (Muon's 8 B for
    matrices), or with the precision-aware optimizer the named dtypes: main grads, FP32 master, two moments
    (dev's V4 recipe, "bf16": 2 B grads and 4 + 2 + 2 = 8 B of state).

    grad_reduce_bf16 (the recipe's --grad-reduce-in-bf16): the per-parameter grad buffer is the param dtype,
    BF16, whatever the main grads' dtype (dev megatron/core/distributed/param_and_grad_buffer.py:924
    `grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype`). FP32 main grads then exist only as the
    optimizer's shard: a view of the buffer with the precision-aware optimizer, else an FP32 copy of the shard
    made after backward (dev megatron/core/optimizer/distrib_optimizer.py:2784-2792), when the activations are
    gone, so not at the peak this model sizes."""
    if precision_aware(model, stage, optim):
        grads, params, avg, avg_sq = OPTIM_DTYPES[optim]
        g, state = DTYPE_BYTES[grads], DTYPE_BYTES[params] + DTYPE_BYTES[avg] + DTYPE_BYTES[avg_sq]
    else:
        g, state = GRAD_BYTES, MUON_BYTES if str(model.optimizer).lower().endswith("muon") else ADAM_BYTES
    return (min(g, WEIGHT_BYTES) if grad_reduce_bf16 else g), state


def stage_memory(
    model: ModelConfig,
    hw: HardwareConfig,
    stage: StageConfig,
    layout: Layout,
    groups: Groups,
    blocks_per_segment: Sequence[int],
    routing_sigma: float = DEFAULT_ROUTING_SIGMA,
    recipe: RecipeConfig | None = None,
) -> list[StageMemory]:
    """Peak memory of one GPU on each PP rank (summing its virtual segments), decimal GB. The layout's optimizer
    precision (its `optim` knob) and the recipe's grad buffer dtype set the grad and state bytes
    (optimizer_bytes; recipe None: RecipeConfig's defaults)."""
    pp, vpp, tp, cp, ep, etp = layout.pp, layout.vpp, layout.tp, layout.cp, layout.ep, layout.etp
    bps, n = checked_split(model, stage, layout, blocks_per_segment)
    key = model_key(model)
    pc = param_counts(model, n)
    px = _prefix(key, n, tuple(layout.recompute), tuple(layout.offload), layout.precision in FP8_PRECISIONS)
    d_a, d_e = groups.d_a or 1, groups.d_e or 1
    m = groups.m or 1
    dist = bool(stage.use_distributed_optimizer)
    dense_shard = d_a * cp if dist else 1
    expert_shard = d_e if dist else 1
    grad_b, ob = optimizer_bytes(model, stage, layout.optim, bool(recipe and recipe.grad_reduce_in_bf16))
    adam = ob if precision_aware(model, stage, layout.optim) else ADAM_BYTES
    h, v = model.hidden_size, model.vocab_size
    skew = moe_model.rank_skew(routing_sigma, model.num_experts, ep, layout.capacity_factor)
    tokens = layout.mbs * stage.seq_length / cp / tp  # per GPU per microbatch
    mtp_depth = pc.mtp_layers
    tg = moe_model.t_group(ep, layout.mbs, stage.seq_length, cp)
    if layout.dispatcher == "allgather":
        comm = 2 * tg * h * ACT_BYTES / GB
    else:
        comm = moe_model.dispatch_buffer_gb(tg, model.moe_router_topk, ep, h, skew, ACT_BYTES)
        if layout.dispatcher == "flex":
            comm += FLEX_BUFFER_GB
    out: list[StageMemory] = []
    for r, (dense_p, routed_p, act_d, act_e, blocks, moe_blocks) in enumerate(_rank_sums(px, bps, pp, vpp)):
        first, last = r == 0, r == pp - 1
        emb_p = pc.embedding if (first or (last and mtp_depth)) else 0
        head_p = pc.output_head if last else 0
        mtp_routed = mtp_dense = 0.0
        if last and pc.mtp_block is not None:
            mtp_routed = mtp_depth * pc.mtp_block.routed_experts
            mtp_dense = mtp_depth * pc.mtp - mtp_routed
            act_d += mtp_depth * px.mtp_act[0]
            act_e += mtp_depth * px.mtp_act[1]
        # per-GPU parameter counts
        routed_g = (routed_p + mtp_routed) / (ep * etp)
        dense_g = (dense_p + mtp_dense) / tp
        extra_g = (emb_p + head_p) / tp
        weights_gb = WEIGHT_BYTES / GB
        live = in_flight(r, pp, vpp, m)
        act = live * tokens * (act_d + act_e * skew) * ACT_BYTES
        act += tokens * px.working * ACT_BYTES  # full recompute: one block rebuilt at a time
        if last:
            act += tokens * v * LOGIT_BYTES * (1 + mtp_depth)  # b S/CP x V/TP
        out.append(
            StageMemory(
                stage=r,
                blocks=int(blocks),
                moe_blocks=int(moe_blocks),
                routed_weights=routed_p / (ep * etp) * weights_gb,
                dense_weights=dense_p / tp * weights_gb,
                embedding=emb_p / tp * weights_gb,
                head=head_p / tp * weights_gb,
                mtp=((mtp_routed / (ep * etp)) + mtp_dense / tp) * weights_gb,
                grads=(routed_g + dense_g + extra_g) * grad_b / GB,
                optimizer=(routed_g * ob / expert_shard + dense_g * ob / dense_shard + extra_g * adam / dense_shard)
                / GB,
                activations=act / GB,
                dispatch_buffers=comm if (moe_blocks or (last and mtp_depth)) else 0.0,
                workspace=hw.workspace_gb,
                runtime=hw.runtime_overhead_gb,
            )
        )
    return out


def recompute_key(recompute: Sequence[str]) -> str:
    """The name of a recompute set for per-set activation factors: sorted modules joined by '+', or 'none'."""
    return "+".join(sorted(recompute)) or "none"


def scaled_terms(terms: Mapping[str, float], scale: MemoryScale, recompute: Sequence[str] = ()) -> float:
    """sum_t factor_t x term_t: a stage's calibrated peak from its raw terms (StageMemory.terms()); the
    activation term also takes its recompute set's multiplier when the scale has one."""
    if not isinstance(scale, Mapping):
        return sum(terms.values()) * scale
    per_set = _per_set(scale, recompute)
    return sum(scale.get(t, 1.0) * v * (per_set if t == "activations" else 1.0) for t, v in terms.items())


def _per_set(scale: Mapping[str, float], recompute: Sequence[str]) -> float:
    return scale.get(f"activations@{recompute_key(recompute)}", scale.get("activations@*", 1.0))


def term_factors(scale: Mapping[str, float], recompute: Sequence[str] = ()) -> tuple[float, float, float, float]:
    """scaled_terms' multipliers for one recompute set, (states, activations, the set's activations, buffers):
    the planner resolves them once per set and calibration, not once per layout and rank (scaled_total)."""
    return (
        scale.get("states", 1.0),
        scale.get("activations", 1.0),
        _per_set(scale, recompute),
        scale.get("buffers", 1.0),
    )


def scaled_total(terms: Mapping[str, float], f: tuple[float, float, float, float]) -> float:
    """scaled_terms of StageMemory.terms() with term_factors' multipliers: the same products summed in the
    same order (states, activations, buffers), so the same float."""
    return f[0] * terms["states"] + f[1] * terms["activations"] * f[2] + f[3] * terms["buffers"]


def heaviest(stages: Sequence[StageMemory]) -> StageMemory:
    """The rank with the largest total (the first on ties): it decides feasibility."""
    return max(stages, key=lambda s: (s.total, -s.stage))


def is_feasible(stages: StageMemory | Sequence[StageMemory], stage: StageConfig, hw: HardwareConfig) -> bool:
    """heaviest.total + stage.memory_margin_gb <= hw.hbm_gb (accepts one StageMemory or a list)."""
    top = stages if isinstance(stages, StageMemory) else heaviest(stages)
    return bool(top.total + stage.memory_margin_gb <= hw.hbm_gb)
