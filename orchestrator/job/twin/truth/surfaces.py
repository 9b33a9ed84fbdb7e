"""The named surfaces: the hidden constants of the simulated machine, drawn from (surface, twin.seed).

Every surface is the same machine (machine.py) with different constants. `balanced` (the default) draws
every effect mildly; each other surface makes one effect the planner does not model dominant, and its seed
moves where that effect bites, so twin.seed moves the optimum, not only the noise:

  gemm       grouped-GEMM efficiency is a steep, tile-quantized curve of the per-expert batch T_expert
             (half-efficiency point and steepness drawn): EP, micro-batch and CP move T_expert.
  span       all-to-all bandwidth falls with the nodes an EP group spans, and each dispatcher backend has
             its own bandwidth, overlap with compute and span beyond which both collapse (drawn).
  memory     activation memory mis-sized per component: attention, MoE and mHC activations each 2-3x
             smaller (mostly) or larger than their tensors suggest (directions and sizes drawn).
  imbalance  block kinds (CSA / HCA / window attention), the first stage's embedding and the last stage's
             head + loss cost differently from their FLOPs (drawn), so a FLOP-balanced pipeline split has
             a slow stage.
  tails      every all-to-all waits for the slowest EP rank: a fixed per-pass jitter (so many small
             microbatches pay more than few large ones) and a relative one, both growing with the EP
             group's node span; stragglers (p99) whose rate grows with the span too (drawn strengths).
  mixed      the held-out generator (tests/bench tunes on none of its seeds): every effect at once, drawn
             wide: each activation term 0.5-3x its tensors, the grouped-GEMM knee anywhere from 200 to
             3,000 tokens per expert, NIC bandwidth, span knees and falloffs, dispatcher overlap, stage
             imbalance, so its optimum sits where no named surface put one.
  overpredicted  memory over-predicted about 2x (every activation term about half its tensors), GEMMs
             efficient at a few hundred tokens per expert and dispatchers that hold up across nodes: the
             wide-EP (EP128), no-recompute region a pessimistic memory model prunes holds the optimum.

Held out for issue 48's failure modes (a sweep missed a no-recompute neighbour the model over-charged):
  overcharged  what selective recompute saves is 5-10x smaller than its tensors say: each tensor a light
             recompute module frees (LIGHT: mla_up_proj, mhc, layernorm, moe_act, shared_experts, core_attn)
             is stored at 1/10-1/5 of its size, so dropping that recompute costs a few GB, not tens.
  sibling    overcharged, and each light module's recompute redoes 8-16% of a block's forward: the optimum
             has no light recompute and its one-knob sibling with one module is 2-5% slower, a miss of the goal
             when the sweep measures the sibling and not the optimum; the allocator reserves more (frag
             0.10-0.16), so the optimum sits near the capacity the model's over-charge puts it above.
  wideband   mixed, and every stored tensor sized 0.1-8x its group's scale on its own draw: no per-term
             memory factor fits the measured layouts, so a calibrated band runs wider than the GPU.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from functools import lru_cache

from orchestrator.core.schema import TwinSurface
from orchestrator.job.twin.truth.shape import RECOMPUTE_FREES, TENSOR_GROUP


@dataclass(frozen=True)
class Backend:
    """How one dispatcher backend moves tokens: NIC bandwidth share, overlap with compute, and the
    node span beyond which both fall off (as (knee / span) ** falloff)."""

    bw: float  # x the NIC's achievable bandwidth
    overlap: float  # share of the all-to-all hidden behind compute up to the knee
    knee: int  # nodes
    falloff: float


@dataclass(frozen=True)
class Quirks:
    """The machine's hidden constants (the planner knows none of them)."""

    dense_eff: float = 0.62  # dense GEMM efficiency on large tokens-per-microbatch
    dense_t_half: float = 600.0  # tokens per microbatch at which dense GEMMs run at half that
    attn_eff: float = 0.45  # attention kernel efficiency on long local sequences
    attn_l_half: float = 900.0  # local query rows (S / CP) at which it halves
    exp_eff: float = 0.60  # grouped-GEMM efficiency on large per-expert batches
    exp_t_half: float = 700.0  # per-expert batch (tokens) at half efficiency
    exp_power: float = 1.2  # steepness of that curve
    exp_tile: int = 128  # tokens per expert are padded to this tile
    block_cost: dict[str, float] = field(default_factory=lambda: {"C": 1.0, "H": 1.0, "W": 1.0})
    head_cost: float = 1.0  # output head + loss, relative to their FLOPs
    first_stage_blocks: float = 0.2  # embedding, mHC stream expansion, input pipeline: in mean blocks
    recompute_cost: dict[str, float] = field(
        default_factory=lambda: {
            "full": 1.0,
            "mla_up_proj": 0.07,
            "mhc": 0.05,
            "moe_act": 0.03,
            "layernorm": 0.02,
            "moe": 0.55,
            "shared_experts": 0.05,
            "mlp": 0.5,
            "core_attn": 0.3,
        }
    )  # share of a block's forward redone in backward
    nvl_eff: float = 0.75
    nic_eff: float = 0.7
    congestion: float = 0.35  # NIC bandwidth / (1 + congestion x log2(nodes spanned))
    backends: dict[str, Backend] = field(
        default_factory=lambda: {
            "alltoall": Backend(0.85, 0.0, 16, 0.0),
            "allgather": Backend(0.9, 0.0, 16, 0.0),
            "flex:deepep": Backend(1.0, 0.3, 8, 0.5),
            "flex:hybridep": Backend(1.05, 0.4, 4, 0.5),
            "flex:ncclep": Backend(0.95, 0.2, 8, 0.5),
        }
    )
    a2a_latency_s: float = 40e-6  # per all-to-all pass
    cp_latency_s: float = 25e-6  # per CP ring step
    p2p_exposed: float = 0.5  # share of a PP send/recv on the critical path (0.7 of it without VPP)
    chunk_overhead_s: float = 4e-4  # per virtual chunk per microbatch: scheduling, launch, small p2p
    grad_hide: float = 0.8  # share of the last microbatch's backward that hides the gradient reduce
    jitter: float = 0.006  # per-rank compute jitter (relative) at each EP synchronisation
    sync_jitter_s: float = 1e-4  # per-rank jitter (seconds) of each all-to-all pass, whatever its size
    span_jitter: float = 0.2  # both x (1 + span_jitter x log2(nodes spanned))
    tail_per_node: float = 0.05  # straggler rate x (1 + tail_per_node x (nodes spanned - 1))
    act: dict[str, float] = field(default_factory=lambda: {"attn": 1.0, "moe": 1.0, "mhc": 1.0, "norm": 1.0})
    # per stored tensor (shape.TENSOR_GROUP's names), x its group's `act`: a tensor sized unlike its group
    tensor_act: dict[str, float] = field(default_factory=dict)
    logits_bytes: float = 6.0  # per logit on the last stage: fp32 logits + bf16 copy
    buffer_gb: dict[str, float] = field(
        default_factory=lambda: {"flex:deepep": 1.5, "flex:hybridep": 2.0, "flex:ncclep": 1.0}
    )  # registered dispatch buffers, + 0.25 GB per node spanned
    frag: float = 0.06  # allocator reserve over the allocated peak
    runtime_gb: float = 2.5  # CUDA context, NCCL, cuBLAS workspaces


def _lu(r: random.Random, lo: float, hi: float) -> float:
    """Log-uniform draw."""
    return math.exp(r.uniform(math.log(lo), math.log(hi)))


def _balanced(r: random.Random) -> Quirks:
    """Every effect present and moderate; the seed draws each (which dispatcher, recompute set and split win)."""
    q = Quirks()
    return replace(
        q,
        dense_eff=r.uniform(0.56, 0.66),
        exp_t_half=_lu(r, 300, 1500),
        attn_l_half=_lu(r, 600, 1400),
        congestion=r.uniform(0.25, 0.45),
        block_cost={s: r.uniform(0.9, 1.15) for s in q.block_cost},
        head_cost=r.uniform(1.0, 1.6),
        backends={
            name: replace(b, bw=b.bw * r.uniform(0.85, 1.2), overlap=b.overlap * r.uniform(0.5, 1.5))
            for name, b in q.backends.items()
        },
        act={"attn": r.uniform(0.45, 0.8), "moe": r.uniform(0.7, 1.2), "mhc": r.uniform(1.0, 1.6), "norm": 0.7},
    )


def _gemm(r: random.Random) -> Quirks:
    return replace(
        _balanced(r), exp_t_half=_lu(r, 700, 2500), exp_power=r.uniform(1.1, 1.6), exp_tile=r.choice((128, 256))
    )


def _span(r: random.Random) -> Quirks:
    q = _balanced(r)
    backends = dict(q.backends)
    for name in ("flex:deepep", "flex:hybridep", "flex:ncclep"):
        backends[name] = Backend(
            bw=r.uniform(0.8, 1.3), overlap=r.uniform(0.1, 0.6), knee=r.choice((2, 4, 8)), falloff=r.uniform(0.5, 1.0)
        )
    backends["alltoall"] = Backend(r.uniform(0.6, 0.9), r.uniform(0.0, 0.2), r.choice((4, 8, 16)), 0.5)
    return replace(q, congestion=r.uniform(0.3, 0.7), backends=backends)


def _memory(r: random.Random) -> Quirks:
    """Each of the attention, MoE and mHC activations 2-3x off, down (p = 2/3) or up; at least one down."""
    q = _balanced(r)
    act = dict(q.act)
    groups = ("attn", "moe", "mhc")
    down = [g for g in groups if r.random() < 2 / 3] or [r.choice(groups)]
    for g in groups:
        x = r.uniform(2.0, 3.0)
        act[g] = 1 / x if g in down else x
    return replace(q, act=act, frag=r.uniform(0.04, 0.12))


def _imbalance(r: random.Random) -> Quirks:
    return replace(
        _balanced(r),
        block_cost={s: _lu(r, 0.5, 2.0) for s in ("C", "H", "W")},
        head_cost=_lu(r, 2.0, 5.0),
        first_stage_blocks=r.uniform(0.5, 2.5),
    )


def _tails(r: random.Random) -> Quirks:
    return replace(
        _balanced(r),
        jitter=r.uniform(0.01, 0.03),
        sync_jitter_s=_lu(r, 1e-4, 1.5e-3),
        span_jitter=r.uniform(0.5, 1.5),
        tail_per_node=r.uniform(0.3, 1.0),
    )


def _mixed(r: random.Random) -> Quirks:
    q = _balanced(r)
    backends = {
        name: Backend(
            bw=b.bw * r.uniform(0.7, 1.3),
            overlap=r.uniform(0.0, 0.7) if name.startswith("flex") else r.uniform(0.0, 0.2),
            knee=r.choice((2, 4, 8, 16)),
            falloff=r.uniform(0.2, 1.0),
        )
        for name, b in q.backends.items()
    }
    return replace(
        q,
        act={g: _lu(r, 0.5, 3.0) for g in ("attn", "moe", "mhc", "norm")},
        exp_t_half=_lu(r, 200, 3000),
        exp_power=r.uniform(1.0, 1.6),
        exp_tile=r.choice((64, 128, 256)),
        nic_eff=r.uniform(0.45, 0.9),
        congestion=r.uniform(0.15, 0.7),
        backends=backends,
        block_cost={s: _lu(r, 0.7, 1.5) for s in ("C", "H", "W")},
        head_cost=_lu(r, 1.0, 3.5),
        first_stage_blocks=r.uniform(0.2, 2.0),
        frag=r.uniform(0.04, 0.12),
    )


def _overpredicted(r: random.Random) -> Quirks:
    q = _balanced(r)
    backends = {
        name: replace(b, bw=b.bw * 1.3, knee=max(b.knee, 16), falloff=0.2, overlap=min(0.9, b.overlap * 2.0 + 0.2))
        for name, b in q.backends.items()
    }
    return replace(
        q,
        act={g: r.uniform(0.4, 0.6) for g in ("attn", "moe", "mhc", "norm")},
        exp_t_half=_lu(r, 3000, 5000),
        exp_power=r.uniform(1.4, 1.7),
        nic_eff=r.uniform(0.85, 0.95),
        congestion=r.uniform(0.02, 0.08),
        backends=backends,
        frag=r.uniform(0.03, 0.06),
    )


# The light selective-recompute modules (shape.RECOMPUTE_FREES): each frees one or two tensors, not a block.
LIGHT = ("mla_up_proj", "mhc", "layernorm", "moe_act", "shared_experts", "core_attn")


def _overcharged(r: random.Random) -> Quirks:
    """Balanced, with every tensor a light recompute frees stored at 1/x of its tensors' size (x in 5-10,
    drawn per tensor, its group's scale divided out: the planner's charge over the truth is x)."""
    q = _balanced(r)
    light = {t for mod in LIGHT for t in RECOMPUTE_FREES[mod]}
    return replace(q, tensor_act={t: 1.0 / (r.uniform(5.0, 10.0) * q.act[TENSOR_GROUP[t]]) for t in sorted(light)})


def _sibling(r: random.Random) -> Quirks:
    q = _overcharged(r)
    cost = dict(q.recompute_cost) | {mod: r.uniform(0.08, 0.16) for mod in LIGHT}
    return replace(q, recompute_cost=cost, frag=r.uniform(0.10, 0.16))


def _wideband(r: random.Random) -> Quirks:
    return replace(_mixed(r), tensor_act={t: _lu(r, 0.1, 8.0) for t in sorted(TENSOR_GROUP)})


DRAWS = {
    TwinSurface.balanced: _balanced,
    TwinSurface.gemm: _gemm,
    TwinSurface.span: _span,
    TwinSurface.memory: _memory,
    TwinSurface.imbalance: _imbalance,
    TwinSurface.tails: _tails,
    TwinSurface.mixed: _mixed,
    TwinSurface.overpredicted: _overpredicted,
    TwinSurface.overcharged: _overcharged,
    TwinSurface.sibling: _sibling,
    TwinSurface.wideband: _wideband,
}


@lru_cache(maxsize=256)
def quirks(surface: str, seed: int) -> Quirks:
    """The constants of `surface` under `seed` (deterministic; shared: never mutate them)."""
    name = TwinSurface(str(surface))
    return DRAWS[name](random.Random(f"twin-truth:{name.value}:{seed}"))
