"""The simulated machine's physics: one layout's step time and per-stage memory under a surface's Quirks.

Structurally unlike the planner (orchestrator/plan/), on purpose: efficiencies are curves, not constants
(dense GEMMs of the tokens per microbatch, attention of the local sequence S / CP, grouped GEMMs of the
per-expert batch T_expert with tile padding); all-to-all bandwidth and overlap depend on the dispatcher
backend and on the nodes the EP group spans; the pipeline runs (m - 1) x its slowest stage plus the fill
and drain of every stage (so an unbalanced split costs); the gradient reduce hides only behind the last
microbatch's backward; every EP synchronisation waits for the slowest of its ranks; activations are
counted per tensor and scaled per component by the surface.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig
from orchestrator.job.twin.truth.shape import OFFLOAD_FREES, RATIO_OF, RECOMPUTE_FREES, TENSOR_GROUP, Block, Shape
from orchestrator.job.twin.truth.surfaces import Quirks

GB = 1e9
HBM_GB_S = 4000.0  # HBM bandwidth for memory-bound passes (optimizer, loss)
PCIE_GB_S = 40.0  # activation offload to host
NCCL_GB = 1.0  # of the runtime's reserve: NCCL's communicators and buffers (a fake process group has none)
OPT_BYTES = {"muon": 8.0, "adam": 12.0}  # FP32 master + optimizer moments per parameter


@dataclass(frozen=True)
class Knobs:
    """The layout's knobs, as the machine reads them (any object with these attributes will do)."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    recompute: tuple[str, ...]
    offload: tuple[str, ...]
    dispatcher: str  # label: alltoall | allgather | flex:<backend>
    capacity_factor: float | None
    precision: str = "bf16"  # the GEMMs' (knobs.PRECISIONS name)


@dataclass(frozen=True)
class StageMem:
    """One GPU of one pipeline stage, GB (decimal)."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    runtime: float
    frag: float

    @property
    def allocated(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers

    @property
    def reserved(self) -> float:
        return self.allocated * (1.0 + self.frag) + self.runtime

    @property
    def probe_reserved(self) -> float:
        """What one rank reserves alone under a fake process group: no dispatcher buffers (a probe runs no
        all-to-all, and a flex layout is probed with alltoall) and no NCCL communicator memory."""
        return (self.allocated - self.buffers) * (1.0 + self.frag) + self.runtime - NCCL_GB


@dataclass(frozen=True)
class Run:
    """What one step of the layout costs: seconds by Megatron timer, per-stage memory, the straggler rate."""

    step_s: float
    forward_backward_s: float
    grad_sync_s: float
    optimizer_s: float
    stage_s: tuple[float, ...]  # per-microbatch time of each PP stage
    # one step of one rank of each PP stage run alone (Megatron's --fake-process-group): its m microbatches'
    # compute and its optimizer step; no collective, no all-to-all, no pipeline bubble
    probe_s: tuple[float, ...]
    memory: tuple[StageMem, ...]
    tail_scale: float  # x the twin's tail_prob
    flops_per_step: float


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def hot_rank(sigma: float, experts_per_rank: float, ep: int) -> float:
    """Tokens on the busiest EP rank over the mean: lognormal expert loads summed per rank, max of EP."""
    if ep <= 1:
        return 1.0
    cv = math.sqrt(max(math.exp(sigma**2) - 1.0, 0.0) / max(experts_per_rank, 1.0))
    return 1.0 + cv * math.sqrt(2.0 * math.log(ep))


def _overlap(b, span: int) -> tuple[float, float]:
    """(bandwidth multiplier, hidden share) of a backend at `span` nodes."""
    if span <= b.knee:
        return b.bw, b.overlap
    fall = (b.knee / span) ** b.falloff
    return b.bw * fall, b.overlap * fall


def run(model: ModelConfig, hw: HardwareConfig, stage: StageConfig, lay, sh: Shape, q: Quirks, skew: float) -> Run:
    """Step time and memory of `lay` on `stage.gpus` GPUs (see the module docstring)."""
    n, gpn, S = stage.gpus, stage.gpus_per_node, stage.seq_length
    pp, vpp, tp, cp, ep, etp, b = lay.pp, lay.vpp, lay.tp, lay.cp, lay.ep, lay.etp, lay.mbs
    d_a = max(1, n // (tp * cp * pp))
    d_e = max(1, n // (etp * ep * pp))
    m = max(1, stage.global_batch // (b * d_a))
    t = b * S / cp / tp  # tokens per GPU per microbatch
    k, E, h = model.moe_router_topk, model.num_experts, model.hidden_size
    peak = (hw.peak_fp8_tflops if lay.precision == "fp8" else hw.peak_bf16_tflops) * 1e12
    peak_attn = hw.peak_bf16_tflops * 1e12
    nvl, nic = hw.nvlink_gb_s * GB * q.nvl_eff, hw.nic_gb_s * GB * q.nic_eff
    ep_span, cp_span = _ceil_div(ep * etp, gpn), _ceil_div(cp * tp, gpn)

    # efficiencies: curves of the shapes the kernels see
    eff_dense = q.dense_eff * t / (t + q.dense_t_half)
    local = S / cp
    eff_attn = q.attn_eff * local / (local + q.attn_l_half)
    hot = hot_rank(skew, E / ep, ep)
    if lay.capacity_factor:
        hot = min(hot, lay.capacity_factor)
    t_expert = ep * t * k / E  # tokens per routed expert per microbatch
    padded = _ceil_div(max(1, math.ceil(t_expert)), q.exp_tile) * q.exp_tile
    eff_exp = q.exp_eff * t_expert**q.exp_power / (t_expert**q.exp_power + q.exp_t_half**q.exp_power)
    eff_exp *= t_expert / padded
    recompute = tuple(lay.recompute)
    _, offloaded = freed(recompute, tuple(lay.offload))
    redo = 1.0 if "full" in recompute else sum(q.recompute_cost.get(x, 0.1) for x in recompute)

    # one MoE layer's all-to-all per microbatch (4 passes: dispatch + combine, forward + backward)
    a2a = 0.0
    passes = 4 + (2 if ("moe" in recompute or "full" in recompute) else 0)
    if ep > 1:
        label = lay.dispatcher
        be = q.backends.get(label) or q.backends["alltoall"]
        bw_mult, hidden = _overlap(be, ep_span)
        one_domain = label == "flex:hybridep" and ep * etp <= hw.gpus_per_nvlink_domain
        span = 1 if one_domain else ep_span
        if label == "allgather":
            remote, near = (ep - 1) * (1 - 1 / span), (ep - 1) / span
        elif span <= 1:
            remote, near = 0.0, float(k)
        elif label.startswith("flex"):  # one copy per remote node, fanned out over NVLink there
            remote, near = (span - 1) * (1 - (1 - 1 / span) ** k), float(k)
        else:
            remote, near = k * (1 - 1 / span), k / span
        tok = t * h * 2.0 * hot
        bw_nic = nic * bw_mult / (1.0 + q.congestion * math.log2(span)) if span > 1 else nic
        per_pass = max(remote * tok / bw_nic, near * tok / nvl) + q.a2a_latency_s
        a2a = passes * per_pass * (1.0 - hidden)
    # every all-to-all waits for the slowest of EP ranks: E[max] of EP draws, wider across more nodes
    spread = math.sqrt(2 * math.log(ep)) * (1 + q.span_jitter * math.log2(ep_span)) if ep > 1 else 0.0

    memo: dict[int, float] = {}  # blocks of one kind are one object (shape.py)
    memo_c: dict[int, float] = {}

    def block_fwd(bl: Block) -> float:
        fwd = t * (
            bl.gemm_flops / (peak * eff_dense)
            + bl.attn_flops / (peak_attn * eff_attn) / tp
            + bl.expert_flops * hot / (peak * max(eff_exp, 1e-6))
        )
        return fwd * q.block_cost.get(bl.symbol, 1.0)

    def offload_s(bl: Block) -> float:
        if not offloaded:  # out in forward, back in backward, half of it behind compute
            return 0.0
        return t * sum(v for name, v in bl.tensors if name in offloaded) * 2.0 * 2 / (PCIE_GB_S * GB) * 0.5

    def block_compute_s(bl: Block) -> float:
        """The block's own kernels (and offload copies) alone: no all-to-all, no EP wait, no CP exchange."""
        if id(bl) not in memo_c:
            memo_c[id(bl)] = (3.0 + redo) * block_fwd(bl) + offload_s(bl)
        return memo_c[id(bl)]

    def block_s(bl: Block) -> float:
        if id(bl) in memo:
            return memo[id(bl)]
        fwd = block_fwd(bl)
        s = (3.0 + redo) * fwd * (1.0 + q.jitter * spread)
        if bl.moe:
            s += a2a + passes * q.sync_jitter_s * spread
        s += offload_s(bl)
        if cp > 1:
            ratio = RATIO_OF[bl.symbol]
            kv = (S / ratio if ratio else 0.0) * (cp - 1) / cp * b * model.kv_lora_rank * 2.0
            s += 2.0 * (kv / (nvl if cp_span <= 1 else nic) + (cp - 1) * q.cp_latency_s)
        memo[id(bl)] = s
        return s

    last = pp - 1
    p2p = 0.0
    if pp > 1:
        bw = nic if n // pp >= gpn else nvl
        hop = t * h * max(1, model.hyper_connection_streams) * 2.0 / bw
        p2p = 2 * vpp * hop * q.p2p_exposed * (1.4 if vpp == 1 else 1.0) + vpp * q.chunk_overhead_s
    n_blocks = sum(len(seg) for seg in sh.segments)
    mean_block = sum(block_s(bl) for seg in sh.segments for bl in seg) / max(1, n_blocks)
    mean_compute = sum(block_compute_s(bl) for seg in sh.segments for bl in seg) / max(1, n_blocks)
    stage_s, compute_s, grad_s, opt_s, mems = [], [], [], [], []
    opt_b = OPT_BYTES.get(str(model.optimizer).lower(), 12.0)
    dist = stage.use_distributed_optimizer
    for r in range(pp):
        kinds = sh.rank_kinds(r, pp)
        ts = sum(block_s(bl) * c for bl, c in kinds) + (p2p if pp > 1 else 0.0)
        tc = sum(block_compute_s(bl) * c for bl, c in kinds)
        if r == 0:
            ts += q.first_stage_blocks * mean_block
            tc += q.first_stage_blocks * mean_compute
        dense = sum(bl.dense_params * c for bl, c in kinds) / tp
        expert = sum(bl.expert_params * c for bl, c in kinds) / (ep * etp)
        extra = (
            (sh.embedding_params if r == 0 or (r == last and sh.mtp) else 0.0) + (sh.head_params if r == last else 0.0)
        ) / tp
        if r == last:  # output head (main + each MTP depth) and the loss: GEMM + memory-bound softmax
            heads = 1 + len(sh.mtp)
            gemm = heads * t * sh.head_flops / (peak * eff_dense)
            loss = heads * t * model.vocab_size / tp * 4.0 * 3 / (HBM_GB_S * GB)
            ts += (3.0 * gemm + loss) * q.head_cost
            tc += (3.0 * gemm + loss) * q.head_cost
        stage_s.append(ts)
        compute_s.append(tc)
        # gradient reduce-scatter + parameter all-gather over DP, hidden behind the last backward only
        g_d, g_e = d_a * cp, d_e
        moved = (dense + extra) * (g_d - 1) / g_d + expert * (g_e - 1) / g_e
        sync = moved * 6.0 / (nic if n // pp > gpn else nvl)
        grad_s.append(max(0.0, sync - q.grad_hide * ts * 2.0 / 3.0))
        local = (dense + extra) / (g_d if dist else 1) + expert / (g_e if dist else 1)
        ns = 30.0 * min(h, model.moe_ffn_hidden_size) if str(model.optimizer).lower() == "muon" else 0.0
        opt_s.append(local * 24.0 / (HBM_GB_S * GB) + local * ns / (peak_attn * 0.5))
        mems.append(_memory(model, stage, lay, sh, q, r, kinds, dense, expert, extra, m, t, hot, ep_span, opt_b))
    fill = sum(stage_s) / vpp
    fb = (m - 1) * max(stage_s) + fill
    grad, opt = max(grad_s), max(opt_s)
    flops_tok = sum(bl.gemm_flops + bl.attn_flops + bl.expert_flops for seg in sh.segments for bl in seg)
    flops_tok += sum(bl.gemm_flops + bl.attn_flops + bl.expert_flops for bl in sh.mtp)
    flops_tok += (1 + len(sh.mtp)) * sh.head_flops
    tail = 1.0 + q.tail_per_node * (ep_span - 1)
    return Run(
        step_s=fb + grad + opt,
        forward_backward_s=fb,
        grad_sync_s=grad,
        optimizer_s=opt,
        stage_s=tuple(stage_s),
        probe_s=tuple(m * c + o for c, o in zip(compute_s, opt_s, strict=True)),
        memory=tuple(mems),
        tail_scale=tail,
        flops_per_step=3.0 * flops_tok * stage.global_batch * S,
    )


def in_flight(rank: int, pp: int, vpp: int, m: int) -> float:
    """Microbatches of activations alive on PP rank `rank` at its peak, in whole-rank units: warm-up
    forwards + 1, as Megatron's schedule counts them (megatron/core/pipeline_parallel/schedules.py:903-919,
    commit d48bd6be0a85; microbatch group = PP), each interleaved chunk holding 1/VPP of the rank's blocks."""
    if pp <= 1:
        return 1.0
    if vpp <= 1:
        return float(min(m, pp - rank))
    return min(m * vpp, (pp - rank - 1) * 2 + (vpp - 1) * pp + 1) / vpp


def _kept(bl: Block, gone: frozenset[str], q: Quirks, hot: float) -> float:
    """Stored activation elements per token of one block, each component scaled by the surface; MoE
    tensors sized for the busiest EP rank."""
    out = 0.0
    for name, v in bl.tensors:
        if name not in gone:
            group = TENSOR_GROUP[name]
            out += v * q.act[group] * q.tensor_act.get(name, 1.0) * (hot if group == "moe" and bl.moe else 1.0)
    return out


def freed(recompute: tuple[str, ...], offload: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """(tensors no longer stored, of which those offloaded to the host)."""
    off = frozenset(x for mod in offload for x in OFFLOAD_FREES.get(mod, ()))
    return frozenset(x for mod in recompute for x in RECOMPUTE_FREES.get(mod, ())) | off, off


def _memory(model, stage, lay, sh, q, r, kinds, dense, expert, extra, m, t, hot, ep_span, opt_b) -> StageMem:
    pp, vpp, tp, cp, ep = lay.pp, lay.vpp, lay.tp, lay.cp, lay.ep
    n = stage.gpus
    d_a, d_e = max(1, n // (tp * cp * pp)), max(1, n // (lay.etp * ep * pp))
    dist = stage.use_distributed_optimizer
    recompute = tuple(lay.recompute)
    gone, _ = freed(recompute, tuple(lay.offload))
    streams = max(1, model.hyper_connection_streams) * model.hidden_size
    if "full" in recompute:  # only each block's input stays, one block is rebuilt at a time
        elems = streams * sum(c for _, c in kinds)
        work = max((sum(v for _, v in bl.tensors) for bl, _ in kinds), default=0.0)
    else:
        elems, work = sum(_kept(bl, gone, q, hot) * c for bl, c in kinds), 0.0
    act = (in_flight(r, pp, vpp, m) * t * elems + t * work) * 2.0 / GB
    if r == pp - 1:
        act += t * model.vocab_size / tp * q.logits_bytes * (1 + len(sh.mtp)) / GB
    label = lay.dispatcher
    if ep <= 1 or not any(bl.moe for bl, _ in kinds):
        buffers = 0.0
    elif label == "allgather":
        buffers = 2.0 * ep * t * model.hidden_size * 2.0 / GB
    elif label.startswith("flex"):
        buffers = q.buffer_gb.get(label, 1.0) + 0.25 * ep_span
    else:
        buffers = 2.0 * t * model.moe_router_topk * model.hidden_size * 2.0 * hot / GB
    return StageMem(
        weights=(dense + expert + extra) * 2.0 / GB,
        grads=(dense + expert + extra) * 4.0 / GB,
        optimizer=(
            (dense / (d_a * cp if dist else 1)) * opt_b
            + (extra / (d_a * cp if dist else 1)) * 12.0
            + (expert / (d_e if dist else 1)) * opt_b
        )
        / GB,
        activations=act,
        buffers=buffers,
        runtime=q.runtime_gb,
        frag=q.frag,
    )
