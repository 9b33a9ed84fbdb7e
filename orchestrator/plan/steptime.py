"""Step time of one layout: a sum of named components the policy can calibrate one by one.

    total = sum over c in COMPONENTS of factor_c x base_c

Why linear in per-component factors: the policy fits the factors from measured steps (and the twin
workload hides "truth" multipliers on the same components), so each factor scales its own component
and nothing else.

Per microbatch and GPU on PP rank r (t = b S / CP tokens; blocks from the rank's segments):
  compute      3 x forward FLOPs (+ recompute forwards) / TP, at peak(precision) x efficiency:
               dense GEMMs at gemm_efficiency; the output head at the BF16 peak (Megatron's LM head is a
               plain ColumnParallelLinear outside FP8 unless --fp8-output-proj with MXFP8: megatron-core 0.19.2
               megatron/core/models/gpt/gpt_model.py:264-268, fp8_utils.py:692-707, never emitted; the V4
               path's hybrid_model.py:310 always);
               core attention at attention_efficiency (BF16 peak);
               routed experts at gemm_efficiency x T_expert / (T_expert + EXPERT_GEMM_HALF_TOKENS)
               (small expert batches run grouped GEMMs less efficiently), and x the hot-rank skew;
               every GEMM pass also x K / (K + GEMM_HALF_K), K its reduction width (short_k_efficiency): the
               forward a matrix's input width, dgrad its output width, the dense and head wgrad the microbatch's
               tokens (the experts' wgrad has T_expert's curve already);
               plus what the main-grad accumulation outlasts: every microbatch's wgrad GEMMs add into the main
               grads (Megatron-LM d98e8a64 megatron/core/transformer/moe/experts.py:525, :631
               accumulate_into_main_grad; tensor_parallel/layers.py:721 wgrad_gemm_accum_fp32), a read and a
               write of each local parameter's grad (memory.optimizer_bytes: 4 B, 2 B with BF16 main grads) at
               HBM bandwidth, exposed beyond the wgrad GEMMs' own time, dense and expert apart. It binds where
               many experts sit on one GPU (small EP): all 128 of Qwen3-235B's at EP1, not V4-Pro's EP32-128.
               plus two memory-bound copies at HBM bandwidth, 2 B per element of h per token (t / TP tokens):
               the MoE dispatcher's permutations outside the all-to-all, per MoE layer (permutation_rows:
               alltoall 12k + 4 rows forward + backward, DeepEP 4 (k + r), HybridEP 0, + 3 forward for a shared
               expert's add; the forward again when the MoE layer is recomputed), and every block's two residual
               adds (RESIDUAL_ADD_ROWS; none on V4's mHC path).
  a2a          per MoE layer 4 x t/TP x k x h x 2 B (dispatch + combine, fwd + bwd; x 1.5 when the
               MoE layer is recomputed, which dispatches again), over NVLink when the EP group
               stays in one NVLink domain (ep_domains == 1: one host, or on an NVL72 system one
               64-GPU block of the rack, ranks.allocated_domain), else the remote share
               (1 - 1/ep_nodes) over the NIC; flex dispatchers send a token once per remote node;
               allgather moves the whole group's tokens; x skew (not for allgather: every rank gets
               every token), / a2a_efficiency, x (1 - a2a_overlap); with the recipe's EP A2A overlap
               (--overlap-moe-expert-parallel-comm, argv.overlaps) EP_OVERLAP_HIDDEN of it runs under the rank's
               compute (at most all of the compute): a2a - min(compute, EP_OVERLAP_HIDDEN x a2a) stays exposed.
               Plus, per dropless MoE layer and microbatch (twice when the MoE layer is recomputed, which
               dispatches again), the dispatcher's host wait MOE_HOST_WAIT_S, which no overlap hides: a dropless
               dispatcher sizes its buffers from token counts the host reads from the GPU, so the host stops at
               each MoE layer and launches the rest of the layer while the GPU waits (dev d98e8a64
               megatron/core/transformer/moe/token_dispatcher.py:1173-1178, tokens_per_expert.sum() "(CPU sync)";
               the alltoall dispatcher waits on the d2h copy of its splits, :954-958). Nothing waits with a
               capacity factor (static shapes), with NCCL-EP's fixed receive buffer or with one CUDA graph per
               step (step_time's full_graph: validate's full-iteration rows; argv never emits one).
  cp_exchange  CP > 1: each block gathers the other CP ranks' compressed KV (and CSA indexer keys)
               plus a window of boundary rows, fwd + bwd, over NVLink if the CP group stays in one NVLink
               domain (cp_domains; cp_nodes without domains) else the NIC; on the GPT path (mla, gqa) ring
               attention passes every block's K and V (params.kv_elems) round the CP ranks instead.
  pp_p2p       PP > 1: 2 x VPP boundary transfers of t x h x mHC streams x 2 B per microbatch;
               exposed fully without VPP (Megatron turns p2p overlap off), half with VPP.
  offload      --offload-modules: the bytes the rank's blocks send to the host (memory.offloaded_elems, t / TP
               tokens, experts' x skew) go out in the forward and come back in the backward over the host link
               (hardware.host_link_gb_s x host_link_efficiency, one direction each). Megatron copies on side streams
               (dev d98e8a64 megatron/core/pipeline_parallel/fine_grained_activation_offload.py:472-473 the d2h and
               h2d streams; :1262-1269 a group's D2H starts once its forward ran, and the compute stream waits on it
               only under a max-inflight cap, :1250-1260, unset by default; :1176-1192 the reload on h2d, :1303-1306
               the group's backward waits for it): a copy hides under the compute of its own pass, so the offload
               component is max(0, copy - pass), forward (compute / 3: backward ~ 2 x forward, the 3 x forward FLOPs
               above) and backward (the rest) apart (offload_exposed).
Per step (slowest rank r*, m microbatches):
  compute, a2a, cp_exchange, pp_p2p = m x (rank r*'s per-microbatch value)
  bubble     = m x T(r*) x f / (1 - f), f = pipeline.bubble(PP, m, VPP)  (= T (PP-1) / VPP)
  grad_sync  = ring reduce-scatter of FP32 grads (BF16 with the layout's precision-aware optimizer:
               memory.optimizer_bytes) + all-gather of BF16 params (all-reduce without the
               distributed optimizer), dense over D_a x CP, expert over D_e, sharing the NIC when the
               stage's N/PP GPUs span nodes, / allreduce_efficiency; the reduce x (1 - grad_sync_overlap)
               only when the argv overlaps it (--overlap-grad-reduce), the all-gather only with
               --overlap-param-gather: argv.overlaps(recipe, stage), the same answer argv.py emits from.
  optimizer  = one memory pass over master, moments, grads and weights at HBM bandwidth, plus for Muon
               recipe.muon_num_ns_steps Newton-Schulz iterations on the local shard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from orchestrator.core.schema import HardwareConfig, ModelConfig, RecipeConfig, StageConfig
from orchestrator.plan import moe as moe_model
from orchestrator.plan import pipeline, ranks
from orchestrator.plan.argv import DEFAULT_RECIPE, fixed_receive_buffer, overlaps
from orchestrator.plan.flops import FP8_PRECISIONS, gemm_shapes, peak_tflops, profile, recompute_block
from orchestrator.plan.layout import Groups, Layout
from orchestrator.plan.memory import (
    ACT_BYTES,
    DEFAULT_ROUTING_SIGMA,
    WEIGHT_BYTES,
    block_activation_elems,
    offloaded_elems,
    optimizer_bytes,
)
from orchestrator.plan.params import (
    ModelKey,
    _Frozen,
    block_ratios,
    is_moe_block,
    is_v4,
    kv_elems,
    model_key,
    mtp_ratio,
    param_counts,
)
from orchestrator.plan.pipeline import bubble as bubble_fraction
from orchestrator.plan.pipeline import checked_split, cumulative
from orchestrator.plan.recompute import FULL, redispatches

COMPONENTS = ("compute", "a2a", "cp_exchange", "pp_p2p", "bubble", "grad_sync", "optimizer", "tp_comm", "offload")
# m x the slowest rank's: its stage time
PER_MICROBATCH = ("compute", "a2a", "cp_exchange", "pp_p2p", "tp_comm", "offload")

EXPERT_GEMM_HALF_TOKENS = 256.0  # tokens per expert at which grouped GEMM reaches half its efficiency
# Short-K GEMMs: a GEMM with reduction width K runs at K / (K + GEMM_HALF_K) of its efficiency (short_k_efficiency).
# Fitted on DeepGEMM's dense FP8 table (tests/fixtures/kernel_tables.json, H800, the M 4,096 rows: least squares of
# log TFLOP/s over K / (K + K0) with a free plateau gives K0 411; tests/plan/test_kernel_tables.py recomputes it).
GEMM_HALF_K = 410.0
# Exposed host seconds per dropless MoE layer per microbatch dispatch, by dispatcher (docs/validate.md "Ninth
# pass": each derived from public measurements, none fitted; tests/plan/test_host_wait.py re-derives both).
# alltoall (and allgather, which reads its counts with .cpu()): NVIDIA's pair of Qwen3-30B-A3B rows on 8 B200
# (x86 hosts), EP8 MBS1, the same layout dropless with per-layer router graphs (25.11: 9,299 tokens/s/GPU)
# and token-drop with whole-layer graphs (25.09: 18,066), the step's difference over 64 microbatches x 48 MoE
# layers. flex (DeepEP, HybridEP): NVIDIA's DeepSeek-V3 GB200 guide (Megatron-LM eb0783b6
# docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md:228): removing the sync to
# graph the whole step is worth "at least a 10% additional performance gain" on its 970 TFLOP/s run (HybridEP,
# attention, router, preprocess and shared expert already graphed), 64 microbatches x 8 MoE layers per rank.
MOE_HOST_WAIT_S = {"alltoall": 4.45e-3, "allgather": 4.45e-3, "flex": 1.56e-3}
# Share of the EP communication that Megatron's 1F1B A2A overlap runs under compute: NVIDIA's matched Nsight
# comparison (Megatron-Bridge 067f987d skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md, "HybridEP
# Production-Shape Benchmark": Qwen3-30B-A3B on 16 H100, EP16, HybridEP, MBS1, overlap on): 3,959 ms of
# communication concurrent with GEMM and attention, 36.55% of it (0.11% with overlap off). Not fitted.
EP_OVERLAP_HIDDEN = 0.3655
P2P_EXPOSED_WITH_VPP = 0.5  # share of PP p2p left on the critical path with interleaving (overlap on)
# Memory-bound work a step cannot avoid (norms, activations, RoPE, permutations, casts): per activation element a
# block keeps (memory.block_activation_elems) its producer writes it and its consumer reads it forward, backward
# reads it and writes its gradient: 4 passes x 2 B. An FP8 stage also casts each GEMM operand (read BF16, write FP8
# row- and column-wise): ~4 B more per element. Priors, not fits (docs/validate.md).
ELEMENTWISE_BYTES = 8.0
FP8_CAST_BYTES = 4.0
OPTIMIZER_PASS_BYTES = 24  # per local param: read grad, read+write master and moment(s), write weight
# One residual add (bias-dropout-add, no bias, Megatron-LM dev d48bd6be0a85 transformer_layer.py:793 after attention,
# :1128 after the MLP): forward reads the branch output and the residual and writes their sum (3 rows of h per token);
# backward sums the skip path's gradient with the branch's, the residual having two consumers (3 rows). Two per
# block, BF16, at HBM bandwidth. V4's mHC path has none of its own: fused_mhc_kernels.py:13 h_post_bda folds the add
# into the mHC's stream mix, whose passes the elementwise term already counts (memory.block_activation_elems "mhc").
RESIDUAL_ADDS_PER_BLOCK = 2
RESIDUAL_ADD_ROWS = 6.0
# Every dispatcher adds the shared expert's output to the combined tokens (token_dispatcher.py:933 alltoall, :2092
# flex): 2 rows read, 1 written per token, forward only (the add passes its gradient on uncopied).
SHARED_ADD_ROWS = 3.0


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds per optimizer step: total and the COMPONENTS that sum to it."""

    total_s: float
    components: dict[str, float] = field(default_factory=dict)
    slowest_stage: int = 0
    stage_times_s: tuple[float, ...] = ()  # per-microbatch time of each PP rank (compute + exposed comm)
    # what a one-GPU rank probe of the last rank times (its iteration lines: Megatron prints them on the last
    # rank): its m microbatches' compute (and offload copies) and the optimizer step, no collective; uncalibrated
    probe_s: float = 0.0

    def tokens_per_s(self, tokens_per_step: int) -> float:
        return tokens_per_step / self.total_s if self.total_s > 0 else 0.0


@dataclass(frozen=True, eq=False)
class _TimePrefix:
    gemm: tuple[float, ...]  # forward FLOPs per token, cumulative over blocks
    expert: tuple[float, ...]
    attn: tuple[float, ...]
    recompute: tuple[float, ...]
    moe: tuple[int, ...]
    cp_seq: tuple[float, ...]  # CP gather bytes per sequence token (compressed KV + indexer keys)
    cp_fixed: tuple[float, ...]  # CP window boundary bytes per block
    dense_params: tuple[float, ...]
    routed_params: tuple[float, ...]
    last_gemm: float  # MTP blocks' non-expert work per token
    last_head: float  # the output head's uses (main logits + each MTP depth): BF16 in every precision
    last_expert: float
    last_attn: float
    last_recompute: float
    last_cp_seq: float
    last_cp_fixed: float
    last_moe: int
    embedding: float  # rank 0
    mtp_embedding: float  # the last rank's embedding copy for MTP (PP > 1)
    last_dense: float  # output head, MTP non-expert params
    last_routed: float  # MTP routed experts
    act: tuple[float, ...]  # activation elements per token each block writes (memory.block_activation_elems)
    last_act: float  # the MTP blocks'
    tp_colls: tuple[float, ...]  # sequence-parallel TP collectives per block per microbatch (fwd + bwd)
    last_tp_colls: float
    resid: tuple[float, ...]  # residual-add rows of h per token per block (RESIDUAL_ADD_ROWS; 0 with mHC)
    last_resid: float  # the MTP blocks'


@lru_cache(maxsize=512)
def _time_prefix(key: ModelKey, n: int, seq: int, recompute: tuple[str, ...]) -> _TimePrefix:
    m = _Frozen(key)
    prof = profile(m, seq, n)
    pc = param_counts(m, n)
    rkv, di = m.kv_lora_rank, m.dsa_indexer_head_dim

    gpt_kv = None if is_v4(m) else kv_elems(m) * 2.0  # the GPT path: ring CP passes each block's K and V

    def cp_bytes(ratio: int) -> tuple[float, float]:
        if gpt_kv is not None:
            return gpt_kv, 0.0
        seq_b = 0.0
        if ratio:  # one compressed KV entry (r_kv wide) per `ratio` tokens, BF16
            seq_b = rkv * 2.0 / ratio
        if ratio == 4:  # plus the indexer's compressed keys
            seq_b += di * 2.0 / ratio
        return seq_b, float(m.csa_window_size * rkv * 2)

    cps = [cp_bytes(r) for r in block_ratios(m, n)]
    mb = prof.mtp_block
    depth = prof.mtp_layers
    mtp_cp = cp_bytes(pc.mtp_block.ratio) if pc.mtp_block is not None else (0.0, 0.0)
    return _TimePrefix(
        gemm=cumulative(b.gemm for b in prof.blocks),
        expert=cumulative(b.expert for b in prof.blocks),
        attn=cumulative(b.attn for b in prof.blocks),
        recompute=cumulative(recompute_block(b, recompute) for b in prof.blocks),
        moe=cumulative(1 if b.expert else 0 for b in prof.blocks),
        cp_seq=cumulative(c[0] for c in cps),
        cp_fixed=cumulative(c[1] for c in cps),
        dense_params=cumulative(b.dense for b in pc.blocks),
        routed_params=cumulative(b.routed_experts for b in pc.blocks),
        last_gemm=depth * ((mb.gemm if mb else 0.0) + prof.mtp_extra),
        last_head=prof.head * (1 + depth),
        last_expert=depth * (mb.expert if mb else 0.0),
        last_attn=depth * (mb.attn if mb else 0.0),
        last_recompute=depth * (recompute_block(mb, recompute) if mb else 0.0),
        last_cp_seq=depth * mtp_cp[0],
        last_cp_fixed=depth * mtp_cp[1],
        last_moe=depth if mb is not None and mb.expert else 0,
        embedding=float(pc.embedding),
        mtp_embedding=float(pc.embedding if depth else 0),
        last_dense=float(
            pc.output_head + depth * pc.mtp - depth * (pc.mtp_block.routed_experts if pc.mtp_block else 0)
        ),
        last_routed=float(depth * (pc.mtp_block.routed_experts if pc.mtp_block else 0)),
        act=cumulative(
            float(sum(block_activation_elems(m, r, is_moe_block(m, i)).values()))
            for i, r in enumerate(block_ratios(m, n))
        ),
        last_act=float(depth * sum(block_activation_elems(m, mtp_ratio(m), True).values())) if mb else 0.0,
        tp_colls=cumulative(_tp_collectives(m, is_moe_block(m, i)) for i in range(n)),
        last_tp_colls=float(depth * _tp_collectives(m, True)) if mb else 0.0,
        resid=cumulative(_residual_rows(m, recompute) for _ in range(n)),
        last_resid=depth * _residual_rows(m, recompute) if mb else 0.0,
    )


@lru_cache(maxsize=512)
def _offload_prefix(
    key: ModelKey, n: int, recompute: tuple[str, ...], offload: tuple[str, ...], fp8: bool
) -> tuple[tuple[float, ...], tuple[float, ...], float, float]:
    """Cumulative over blocks, the (dense, expert) elements per token each block's offload sends to the host
    (memory.offloaded_elems), and the MTP depths' (the last rank's)."""
    m = _Frozen(key)
    per = [offloaded_elems(m, r, is_moe_block(m, i), recompute, offload, fp8) for i, r in enumerate(block_ratios(m, n))]
    pc = param_counts(m, n)
    mtp = (0.0, 0.0)
    if pc.mtp_block is not None:
        mtp = offloaded_elems(m, pc.mtp_block.ratio, True, recompute, offload, fp8)
    return cumulative(d for d, _ in per), cumulative(e for _, e in per), pc.mtp_layers * mtp[0], pc.mtp_layers * mtp[1]


def _offloaded_per_rank(model: ModelConfig, n: int, layout: Layout, bps: tuple[int, ...]) -> list[tuple[float, float]]:
    """Per PP rank, the (dense, expert) elements per token its blocks offload (all zero without offload)."""
    if not layout.offload:
        return [(0.0, 0.0)] * layout.pp
    fp8 = layout.precision in FP8_PRECISIONS
    dense, expert, mtp_d, mtp_e = _offload_prefix(
        model_key(model), n, tuple(layout.recompute), tuple(layout.offload), fp8
    )
    out = [(float(d), float(e)) for d, e in pipeline.rank_sums((dense, expert), bps, layout.pp, layout.vpp)]
    d, e = out[-1]
    out[-1] = (d + mtp_d, e + mtp_e)
    return out


def offload_exposed(copy_s: float, compute_s: float) -> float:
    """Seconds of one microbatch's offload copies (copy_s each way) left on the critical path: the D2H beyond its
    forward's compute (compute_s / 3) plus the H2D beyond its backward's (the rest); see the module docstring."""
    if copy_s <= 0:
        return 0.0
    fwd = compute_s / 3.0
    return max(0.0, copy_s - fwd) + max(0.0, copy_s - (compute_s - fwd))


def _residual_rows(model: ModelConfig, recompute: tuple[str, ...]) -> float:
    """Rows of h per token one block's residual adds move (RESIDUAL_ADD_ROWS each, forward + backward; full
    recompute repeats their forward half); none on V4's mHC path (h_post_bda fuses them)."""
    if model.hyper_connection_streams > 1:
        return 0.0
    rows = RESIDUAL_ADDS_PER_BLOCK * RESIDUAL_ADD_ROWS
    return rows * (1.5 if FULL in recompute else 1.0)


def _tp_collectives(model: ModelConfig, moe: bool) -> float:
    """Sequence-parallel all-gathers + reduce-scatters of the b S / CP x h activation one block runs per
    microbatch under TP: attention's all-gather and reduce-scatter forward and again backward (4), and as many
    for a dense MLP or a shared expert (a TP MLP); routed experts with ETP 1 exchange tokens in the all-to-all."""
    mlp = (not moe) or bool(model.moe_shared_expert_intermediate_size)
    return 4.0 + (4.0 if mlp else 0.0)


def short_k_extra(k: float) -> float:
    """The short-K model's one formula: a GEMM reducing over K takes 1 + GEMM_HALF_K / K of its time at full
    efficiency; this is the extra share, GEMM_HALF_K / K."""
    return GEMM_HALF_K / k


def short_k_efficiency(k: float) -> float:
    """Relative GEMM efficiency at reduction width K, K / (K + GEMM_HALF_K) (1 for K >> GEMM_HALF_K)."""
    return 1.0 / (1.0 + short_k_extra(k)) if k > 0 else 0.0


@lru_cache(maxsize=512)
def _short_k(key: ModelKey, n: int) -> tuple[float, float, float]:
    """The short-K slow-down of one model's GEMMs, as extra FLOP-equivalents per FLOP summed over the forward and
    dgrad passes (short_k_extra each): the forward reduces over a matrix's input
    width, dgrad over its output width; the wgrad pass reduces over the tokens (step_time). (dense, expert, head):
    dense FLOP-weighted over the blocks' projections (flops.gemm_shapes; the router and mHC at none), expert over
    fc1 (h -> 2f) and fc2 (f -> h), the output head over h and the vocabulary. Not counted: TP's split of a
    row-parallel matrix's K, and the recomputed forwards (at gemm_efficiency alone)."""
    m, x = _Frozen(key), short_k_extra
    h = m.hidden_size
    prof = profile(m, 4096, n)  # the GEMM FLOPs do not depend on S
    blocks = [(b, r, is_moe_block(m, i)) for i, (b, r) in enumerate(zip(prof.blocks, block_ratios(m, n)))]
    if prof.mtp_block is not None:
        blocks += [(prof.mtp_block, mtp_ratio(m), True)] * prof.mtp_layers
    extra = sum(2.0 * i * o * (x(i) + x(o)) for _, r, moe in blocks for i, o in gemm_shapes(m, r, moe))
    gemm = sum(b.gemm for b, _, _ in blocks)
    f = m.moe_ffn_hidden_size
    expert = (4.0 * h * f * (x(h) + x(2 * f)) + 2.0 * h * f * (x(f) + x(h))) / (6.0 * h * f) if f else 0.0
    return (extra / gemm if gemm else 0.0), expert, x(h) + x(m.vocab_size)


def expert_efficiency(t_expert: float) -> float:
    """Relative grouped-GEMM efficiency at T_expert tokens per expert (1 for large batches)."""
    return t_expert / (t_expert + EXPERT_GEMM_HALF_TOKENS) if t_expert > 0 else 0.0


def _remote_copies(dispatcher: str, k: int, ep: int, ep_nodes: int) -> tuple[float, float]:
    """(copies of a token crossing the network, copies staying on NVLink) per dispatch."""
    if dispatcher == "allgather":
        remote_share = 1 - 1 / ep_nodes if ep_nodes > 1 else 0.0
        return (ep - 1) * remote_share, (ep - 1) * (1 - remote_share)
    if ep_nodes <= 1:
        return 0.0, float(k)
    if dispatcher == "flex":  # DeepEP/HybridEP: one copy per distinct remote node, fan-out on NVLink
        q = 1 - 1 / ep_nodes
        remote = (ep_nodes - 1) * (1 - q**k)
        return remote, float(k) / ep_nodes
    return k * (1 - 1 / ep_nodes), k / ep_nodes


def permutation_rows(
    dispatcher: str, backend: str | None, k: int, ep: int, etp: int, num_experts: int
) -> tuple[float, float]:
    """Rows of h (BF16) one token's MoE layer copies in HBM outside the all-to-all, forward only, as (source rank,
    expert ranks); the backward pass moves the same rows again (each copy's gradient is the inverse copy). Counted
    from Megatron-LM dev d48bd6be0a85 megatron/core/transformer/moe/token_dispatcher.py with --moe-permute-fusion
    (RecipeConfig.moe_permute_fusion: Transformer Engine's fused permute reads a token once and writes its k copies;
    the fused unpermute reads k copies and writes their sum):
      alltoall  :699 permutation 1 (1 read + k writes) and :918 unpermutation 1 (k + 1) on the source rank;
                with more than one local expert and ETP x EP > 1 (:513-515; tp_size is the expert TP group's,
                :84-87), :809 the sort by local expert and :844 its inverse (2k each) on the expert ranks:
                2k + 2 + 4k = 6k + 2;
      flex      DeepEP (:1504 permute, :1518 unpermute): the r rows a token arrives as (one per distinct EP rank it
                goes to, r = EP (1 - (1 - 1/EP)^k) under uniform routing) read and its k copies written, and back:
                2 (k + r); HybridEP fuses both into its dispatch and combine kernels (:1270-1274 return their input):
                0; NCCL EP re-pads its expert rows for combine (:1835-1836 torch.cat): 2k;
      allgather :338 permute (the gathered copies of a token read, up to k, its k local copies written) and :361
                unpermute (k read, the gathered row written back per EP rank): 2k + k + EP.
    The shared expert's add is apart (SHARED_ADD_ROWS)."""
    if dispatcher == "alltoall":
        local = num_experts // max(1, ep)
        sort = 4.0 * k if local > 1 and etp * ep > 1 else 0.0
        return 2.0 * k + 2.0, sort
    if ep <= 1:
        return 0.0, 0.0
    if dispatcher == "flex":
        if backend == "hybridep":
            return 0.0, 0.0
        if backend == "ncclep":
            return 0.0, 2.0 * k
        r = ep * (1.0 - (1.0 - 1.0 / ep) ** k)
        return 0.0, 2.0 * (k + r)
    if dispatcher == "allgather":
        return 0.0, 3.0 * k + ep
    return 0.0, 0.0


def step_time(
    model: ModelConfig,
    hw: HardwareConfig,
    stage: StageConfig,
    layout: Layout,
    groups: Groups,
    blocks_per_segment: Sequence[int],
    ep_nodes: int,
    cp_nodes: int,
    factors: Mapping[str, float] | None = None,
    *,
    routing_sigma: float = DEFAULT_ROUTING_SIGMA,
    recipe: RecipeConfig | None = None,
    ep_domains: int | None = None,
    cp_domains: int | None = None,
    full_graph: bool = False,
) -> StepTime:
    """Predicted step time of `layout` (see the module docstring for every formula). recipe: the workload's
    training recipe (None: RecipeConfig's defaults), which decides what grad sync overlaps. ep_domains /
    cp_domains: NVLink domains one EP / CP group spans (ranks.domain_spans; None: as many as its nodes, a
    HybridEP group that fits hardware.gpus_per_nvlink_domain counting as one). full_graph: the step runs as one
    CUDA graph (Megatron's --cuda-graph-impl full_iteration, which validate's published rows name; argv never
    emits it), so no host wait."""
    recipe = recipe or DEFAULT_RECIPE
    _check_factors(factors)
    pp, vpp, tp, cp, ep, etp, b = layout.pp, layout.vpp, layout.tp, layout.cp, layout.ep, layout.etp, layout.mbs
    bps, n = checked_split(model, stage, layout, blocks_per_segment)
    S = stage.seq_length
    px = _time_prefix(model_key(model), n, S, tuple(layout.recompute))
    m = groups.m or 1
    d_a, d_e = groups.d_a or 1, groups.d_e or 1
    k, h, E = model.moe_router_topk, model.hidden_size, model.num_experts
    t = b * S / cp  # tokens per GPU per microbatch
    peak = peak_tflops(hw, layout.precision) * 1e12
    peak_attn = peak_tflops(hw, "bf16") * 1e12
    tg = moe_model.t_group(ep, b, S, cp)
    skew = moe_model.rank_skew(routing_sigma, E, ep, layout.capacity_factor)
    eff_expert = hw.gemm_efficiency * expert_efficiency(moe_model.t_expert(k, tg, E))
    # all-to-all seconds per MoE layer per microbatch
    nvl = hw.nvlink_gb_s * 1e9
    nic = hw.nic_gb_s * 1e9
    if ep_domains is None:
        domain_gpus = max(1, ep_nodes) * stage.gpus_per_node
        one_domain = ep_nodes <= 1 or (
            layout.dispatcher == "flex"
            and layout.flex_backend == "hybridep"
            and domain_gpus <= hw.gpus_per_nvlink_domain
        )
    else:  # inside one NVLink domain every dispatcher runs on NVLink (NCCL and HybridEP use MNNVL)
        one_domain = ep_domains <= 1
    remote, local = _remote_copies(layout.dispatcher, k, ep, 1 if one_domain else ep_nodes)
    passes = 4.0 * (1.5 if redispatches(layout.recompute) else 1.0)
    # ETP regroups the same GPUs: no change per GPU
    tok_bytes = t / tp * h * 2.0 * passes * moe_model.traffic_skew(layout.dispatcher, skew)
    a2a_layer = max(remote * tok_bytes / nic, local * tok_bytes / nvl) / hw.a2a_efficiency if ep > 1 else 0.0
    a2a_layer *= 1.0 - hw.a2a_overlap
    # CP boundary exchange bandwidth, PP p2p seconds per boundary transfer
    cp_bw = (nvl if (cp_nodes if cp_domains is None else cp_domains) <= 1 else nic) * hw.p2p_efficiency
    p2p_bw = (nic if _pp_crosses_network(hw, stage, pp) else nvl) * hw.p2p_efficiency
    n_streams = max(1, model.hyper_connection_streams)
    p2p = 0.0
    if pp > 1:
        exposed = 1.0 if vpp <= 1 else P2P_EXPOSED_WITH_VPP
        p2p = 2 * vpp * (t * h * n_streams * 2.0 / tp) / p2p_bw * exposed
    sums = _rank_sums(px, bps, pp, vpp)
    a2a_hidden = overlaps(recipe, stage).expert_a2a
    per_rank = []
    elem_bytes = ELEMENTWISE_BYTES + (FP8_CAST_BYTES if layout.precision in FP8_PRECISIONS else 0.0)
    hbm = float(hw.hbm_gb_s) * 1e9
    # one TP collective moves (TP-1)/TP of the full b S / CP x h tensor per GPU, on NVLink inside a host
    tp_bw = (nvl if tp <= stage.gpus_per_node else nic) * hw.allreduce_efficiency
    tp_coll = (tp - 1) / tp * b * S / cp * h * 2.0 / tp_bw if tp > 1 else 0.0
    # every microbatch's weight-gradient GEMMs add into the FP32 (or the layout's optim) main grads: read + write
    # (the recipe's --grad-reduce-in-bf16 halves this traffic in Megatron; not counted here: tried, it raised the
    # held-out calibrated median, docs/validate.md "Eighth pass"; memory counts the BF16 buffer)
    grad_rw = 2.0 * optimizer_bytes(model, stage, layout.optim)[0]
    k_dense, k_expert, k_head = _short_k(model_key(model), n)
    k_wgrad = short_k_extra(t)  # the dense and head wgrad GEMMs reduce over the microbatch's tokens on this GPU
    # the dispatcher's permutation copies per token per MoE layer (permutation_rows): forward, backward, and the
    # forward again when the MoE layer is recomputed; the expert ranks' share x the hot rank's skew
    src_rows, exp_rows = permutation_rows(layout.dispatcher, layout.flex_backend, k, ep, etp, E)
    shared_rows = SHARED_ADD_ROWS if model.moe_shared_expert_intermediate_size else 0.0
    again = redispatches(layout.recompute)
    perm_rows = (src_rows + exp_rows * skew) * (3.0 if again else 2.0) + shared_rows * (2.0 if again else 1.0)
    host_waits = host_wait(layout, again, full_graph)
    offloaded = _offloaded_per_rank(model, n, layout, bps)
    host_bw = hw.host_link_gb_s * 1e9 * hw.host_link_efficiency
    for r, (g, ex, at, rc, cps, cpf, moe_layers, dense_p, routed_p, act, colls, resid) in enumerate(sums):
        head = px.last_head if r == pp - 1 else 0.0
        # one pass (forward, dgrad or wgrad: their mean) of the dense GEMMs and of the experts' grouped GEMMs, each
        # slowed by its reduction width (short_k_efficiency; the experts' wgrad by T_expert, expert_efficiency)
        dense_s = g * (1 + (k_dense + k_wgrad) / 3) / (peak * hw.gemm_efficiency)
        head_s = head * (1 + (k_head + k_wgrad) / 3) / (peak_attn * hw.gemm_efficiency)
        dense_pass = t / tp * (dense_s + head_s)
        expert_pass = t / tp * ex * skew * (1 + k_expert / 3) / (peak * eff_expert if eff_expert else peak)
        compute = (
            3 * (dense_pass + expert_pass)
            + t
            / tp
            * (
                rc / (peak * hw.gemm_efficiency)
                + 3 * at / (peak_attn * hw.attention_efficiency)
                + act * elem_bytes / hbm
                + (moe_layers * perm_rows + resid) * h * 2.0 / hbm
            )
            + max(0.0, dense_p / tp * grad_rw / hbm - dense_pass)
            + max(0.0, routed_p / (ep * etp) * grad_rw / hbm - expert_pass)
        )
        a2a = moe_layers * a2a_layer
        if a2a_hidden:  # 1F1B A2A overlap: a share of dispatch/combine runs under the other microbatch's compute
            a2a -= min(compute, EP_OVERLAP_HIDDEN * a2a)
        a2a += moe_layers * host_waits
        cpx = 2 * ((cp - 1) / cp * b * S * cps + cpf) / cp_bw if cp > 1 else 0.0
        off_d, off_e = offloaded[r]
        copy_s = t / tp * (off_d + off_e * skew) * ACT_BYTES / host_bw
        per_rank.append((compute, a2a, cpx, p2p, colls * tp_coll, offload_exposed(copy_s, compute)))
    totals = [sum(x) for x in per_rank]
    slow = max(range(pp), key=lambda i: (totals[i], -i))
    c_compute, c_a2a, c_cp, c_p2p, c_tp, c_off = per_rank[slow]
    f = bubble_fraction(pp, m, vpp)
    # parameters per GPU on the rank holding the most: what grad sync and the optimizer step wait on
    dense, routed = max(((d / tp, e / (ep * etp)) for *_, d, e, _, _, _ in sums), key=sum)
    comp = {
        "compute": m * c_compute,
        "a2a": m * c_a2a,
        "cp_exchange": m * c_cp,
        "pp_p2p": m * c_p2p,
        "bubble": m * totals[slow] * f / (1 - f) if f < 1 else 0.0,
        "grad_sync": _grad_sync(model, hw, stage, recipe, layout, dense, routed, d_a, d_e),
        "optimizer": _optimizer(model, hw, stage, recipe, layout, dense, routed, d_a, d_e),
        "tp_comm": m * c_tp,
        "offload": m * c_off,
    }
    # a one-GPU probe runs the rank's offload copies too (the host link is its own)
    probe = m * (per_rank[pp - 1][0] + per_rank[pp - 1][5]) + comp["optimizer"]
    raw = StepTime(
        total_s=sum(comp.values()), components=comp, slowest_stage=slow, stage_times_s=tuple(totals), probe_s=probe
    )
    return calibrated(raw, factors)


def host_wait(layout: Layout, again: bool, full_graph: bool = False) -> float:
    """Exposed host seconds per MoE layer per microbatch: the dropless dispatcher's sync (MOE_HOST_WAIT_S), once
    per dispatch (again: the recomputed MoE layer dispatches a second time); none with a capacity factor or one
    CUDA graph per step, nor where argv gives the dispatcher a rank capacity factor (argv.fixed_receive_buffer: a
    fixed receive buffer, static shapes, dev token_dispatcher.py:1486-1488)."""
    if layout.capacity_factor is not None or full_graph or fixed_receive_buffer(layout):
        return 0.0
    return MOE_HOST_WAIT_S[layout.dispatcher] * (2.0 if again else 1.0)


def _check_factors(factors: Mapping[str, float] | None) -> None:
    unknown = set(factors or ()) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown step-time components {sorted(unknown)}; known: {', '.join(COMPONENTS)}")


def calibrated(raw: StepTime, factors: Mapping[str, float] | None) -> StepTime:
    """An uncalibrated step with the step factors applied (`scaled`), as step_time applies them: the planner
    keeps each layout's raw step across calibrations and scales it here. The probe's step stays raw."""
    _check_factors(factors)
    if not factors:
        return raw
    comp = scaled(raw.components, factors)
    return StepTime(
        total_s=sum(comp.values()),
        components=comp,
        slowest_stage=raw.slowest_stage,
        stage_times_s=raw.stage_times_s,
        probe_s=raw.probe_s,
    )


def scaled(comp: Mapping[str, float], factors: Mapping[str, float], fixed: Sequence[str] = ()) -> dict[str, float]:
    """The one rule for applying step factors: each component x its factor (1 if none; 1 for those in `fixed`,
    which a rank probe measured), and the bubble, m x the stage time x f / (1 - f), also x the scaled stage
    time over the raw one. Why: a calibrated stage time moves the idle time it sets; with the bubble on its own
    factor alone, fitted where pipelines are shallow, every deep pipeline kept the raw stage time's bubble
    (docs/search-log.md). The bubble's own factor stays, for what the stage time does not explain."""
    out = {c: v * (1.0 if c in fixed else float(factors.get(c, 1.0))) for c, v in comp.items()}
    stage = sum(comp.get(c, 0.0) for c in PER_MICROBATCH)
    if stage > 0 and "bubble" in out:
        out["bubble"] *= sum(out.get(c, 0.0) for c in PER_MICROBATCH) / stage
    return out


@lru_cache(maxsize=4096)
def _rank_sums(px: _TimePrefix, bps: tuple[int, ...], pp: int, vpp: int) -> tuple[tuple[float, ...], ...]:
    """Per PP rank: (gemm, expert, attn, recompute, cp_seq, cp_fixed, moe layers, dense params,
    routed params) summed over its segments, with the last rank's head/MTP extras. Cached: a planner
    sees few distinct splits, so the per-candidate work is scalar arithmetic over PP ranks."""
    sums = pipeline.rank_sums(
        (
            px.gemm,
            px.expert,
            px.attn,
            px.recompute,
            px.cp_seq,
            px.cp_fixed,
            px.moe,
            px.dense_params,
            px.routed_params,
            px.act,
            px.tp_colls,
            px.resid,
        ),
        bps,
        pp,
        vpp,
    )
    last = (
        px.last_gemm,
        px.last_expert,
        px.last_attn,
        px.last_recompute,
        px.last_cp_seq,
        px.last_cp_fixed,
        px.last_moe,
        px.last_dense,
        px.last_routed,
        px.last_act,
        px.last_tp_colls,
        px.last_resid,
    )
    out = []
    for r, acc in enumerate(map(list, sums)):
        if r == 0:
            acc[7] += px.embedding
        if r == pp - 1:
            for j, x in enumerate(last):
                acc[j] += x
            if pp > 1:
                acc[7] += px.mtp_embedding
        out.append(tuple(acc))
    return tuple(out)


def _dp_crosses_network(hw: HardwareConfig, stage: StageConfig, pp: int) -> bool:
    """Whether one PP stage's N/PP GPUs (its data-parallel groups) reach past NVLink: more than a host, and more
    than the NVLink domain a job's ranks fill (ranks.allocated_domain; an NVL72 rack: 64 GPUs)."""
    per_stage = stage.gpus // pp
    return per_stage > stage.gpus_per_node and per_stage > ranks.allocated_domain(
        hw.gpus_per_nvlink_domain, hw.gpus_per_node
    )


def _pp_crosses_network(hw: HardwareConfig, stage: StageConfig, pp: int) -> bool:
    """Whether PP neighbours (N/PP ranks apart) talk over the network: a stage wider than a host (the rule the
    8-GPU systems have always used) unless the whole job sits in one NVLink domain."""
    return stage.gpus // pp > stage.gpus_per_node and stage.gpus > ranks.allocated_domain(
        hw.gpus_per_nvlink_domain, hw.gpus_per_node
    )


def _grad_sync(
    model: ModelConfig,
    hw: HardwareConfig,
    stage: StageConfig,
    recipe: RecipeConfig,
    layout: Layout,
    dense: float,
    routed: float,
    d_a: int,
    d_e: int,
) -> float:
    per_byte = 1.0 / (hw.nic_gb_s * 1e9 if _dp_crosses_network(hw, stage, layout.pp) else hw.nvlink_gb_s * 1e9)
    ov = overlaps(recipe, stage)
    hidden = 1.0 - hw.grad_sync_overlap
    # FP32, or the layout's BF16 main grads (not the recipe's --grad-reduce-in-bf16: as grad_rw in step_time)
    grad_bytes = optimizer_bytes(model, stage, layout.optim)[0]
    if stage.use_distributed_optimizer:  # reduce-scatter FP32 grads, then all-gather BF16 params
        per_param = grad_bytes * (hidden if ov.grad_reduce else 1.0) + WEIGHT_BYTES * (
            hidden if ov.param_gather else 1.0
        )
    else:  # all-reduce of FP32 grads
        per_param = 2 * grad_bytes * (hidden if ov.grad_reduce else 1.0)
    g_d, g_e = d_a * layout.cp, d_e
    moved = 0.0
    if g_d > 1:
        moved += dense * per_param * (g_d - 1) / g_d
    if g_e > 1:
        moved += routed * per_param * (g_e - 1) / g_e
    return moved * per_byte / hw.allreduce_efficiency


def _optimizer(
    model: ModelConfig,
    hw: HardwareConfig,
    stage: StageConfig,
    recipe: RecipeConfig,
    layout: Layout,
    dense: float,
    routed: float,
    d_a: int,
    d_e: int,
) -> float:
    if stage.use_distributed_optimizer:
        dense, routed = dense / (d_a * layout.cp), routed / d_e
    local = dense + routed
    hbm = float(hw.hbm_gb_s)
    seconds = local * OPTIMIZER_PASS_BYTES / (hbm * 1e9)
    if str(model.optimizer).lower().endswith("muon"):
        m_min = min(model.hidden_size, model.moe_ffn_hidden_size)
        ns_flops = recipe.muon_num_ns_steps * 6.0 * m_min * local  # per NS step ~ 4 m + 2 m^2/n <= 6 m FLOPs per param
        seconds += ns_flops / (peak_tflops(hw, "bf16") * 1e12 * hw.gemm_efficiency)
    return seconds
