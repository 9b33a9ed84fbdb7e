"""sidecar-rank-<r>.json as the router hook writes it on a real job (orchestrator.job.megatron_run), marked simulated:
allocator peaks of the rank and the tokens its router sent to each expert over the measured window.

Routing: expert popularity is lognormal (TwinConfig.routing_skew), a property of the model shared by all
ranks; each rank samples its own counts; a capacity factor drops (and with padding, pads) tokens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from orchestrator.core.paths import JobPaths, atomic_write
from orchestrator.job.node import simulated_facts
from orchestrator.job.twin import truth
from orchestrator.job.twin.job import TwinJob, coords, dp0_ranks, flag, job_rng, rng_for
from orchestrator.plan import probe
from orchestrator.plan.layout import groups
from orchestrator.plan.ranks import evidence_ranks


def moe_layers_on_stage(pattern: str, pp: int, stage: int) -> int:
    """MoE layers ('E') of one PP rank in the hybrid pattern: segment i runs on PP rank i % PP;
    the MTP depths (after '/') run on the last rank."""
    main, *mtp = pattern.split("/")
    count = sum(seg.count("E") for seg in main.split("|")[stage::pp])
    return count + (sum(d.count("E") for d in mtp) if stage == pp - 1 else 0)


def routing(job: TwinJob, rank: int, iters: int) -> dict:
    """Per-expert token counts as the router on `rank` sees them over `iters` measured iterations,
    with lognormal expert popularity (routing_skew) and capacity-factor drops/padding."""
    m, lay = job.model, job.layout
    e, k = max(1, m.num_experts), m.moe_router_topk
    pop_rng = job_rng(job, "popularity")  # expert popularity is a property of the model, not the rank
    w = [math.exp(pop_rng.gauss(0.0, job.twin.routing_skew)) for _ in range(e)]
    total_w = sum(w)
    g = groups(lay, job.world, job.stage.global_batch)
    mb_tokens = lay.mbs * job.stage.seq_length // max(1, lay.cp)  # per microbatch on this rank
    micro = (g.m or 1) * iters
    layers = max(1, moe_layers_on_stage(job.pattern, lay.pp, coords(job, rank)["pp"]))
    rng = rng_for(job, "routing", rank)
    counts, routed, dropped, padded = [0] * e, 0, 0, 0
    pad = bool(flag(job.flags, "moe_pad_expert_input_to_capacity", False))
    cap = math.ceil(lay.capacity_factor * mb_tokens * k / e) if lay.capacity_factor else None
    for i in range(e):
        mean = mb_tokens * k * w[i] / total_w
        c = max(0, round(rng.gauss(mean, math.sqrt(mean))))  # one microbatch-layer sample
        kept = min(c, cap) if cap is not None else c
        counts[i] = kept * micro * layers
        routed += c * micro * layers
        if cap is not None:
            dropped += (c - kept) * micro * layers
            if pad:
                padded += (cap - kept) * micro * layers
    return {
        "tokens_per_expert": counts,
        "dropped_tokens": dropped,
        "padded_tokens": padded,
        "routed_tokens": routed,
        "moe_layers": layers,
        "microbatches": micro,
    }


def write_sidecars(job: TwinJob, surface: truth.Surface, measured: int) -> list[Path]:
    """One sidecar per rank this process speaks for: itself when it is an evidence rank
    (orchestrator.plan.ranks.evidence_ranks), or in single-process mode one per pipeline stage (the
    DP-rank-0, TP-0, CP-0 rank)."""
    if job.job_dir is None:
        return []
    if job.single_process:
        ranks = [r for r in dp0_ranks(job) if coords(job, r)["tp"] == 0 and coords(job, r)["cp"] == 0]
    else:  # one task per GPU: as a real job, only the evidence ranks leave a sidecar
        ranks = [job.rank] if job.rank in evidence_ranks(job.layout, job.world) else []
    folder = JobPaths(job.job_dir)
    paths = []
    for r in ranks:
        stage_idx = coords(job, r)["pp"]
        _alloc, max_alloc, _reserved, max_reserved = truth.rank_memory(surface, stage_idx, f"{job.key}-{r}")
        doc = {
            "simulated": True,
            "source": "twin",
            "rank": r,
            "pp_stage": stage_idx,
            "window": {"warmup_iters": job.warmup_iters, "measure_iters": measured},
            "peak_allocated_mb": round(max_alloc, 2),
            "peak_reserved_mb": round(max_reserved, 2),
            "gpu_total_memory_bytes": round(truth.capacity_gb(job.hw, job.twin) * 1e9),  # get_device_properties
            "capacity_factor": job.layout.capacity_factor,
            "force_balanced_routing": bool(flag(job.flags, "moe_router_force_load_balancing", False)),
            **simulated_facts(),  # what a node would report, its versions marked simulated
        }
        if job.probe:  # what the probe ran with: the mode is part of its provenance (orchestrator/plan/probe.py)
            doc["probe_mode"] = {"mode": job.probe_mode or probe.OFF, "simulated": True}
            doc["versions"] = {**doc["versions"], "probe_mode": job.probe_mode or probe.OFF}
        if coords(job, r)["tp"] == 0:  # TP replicas see the same tokens: only TP rank 0 counts them
            doc.update(routing(job, r, measured))
        paths.append(atomic_write(folder.sidecar(r), json.dumps(doc)))
    return paths
