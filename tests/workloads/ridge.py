#!/usr/bin/env python3
"""An external stand-in for Megatron with a ridge surface (NOT the twin, NOT surface.py or cliffs.py).

Written after the search's defaults were tuned, and never tuned on: the unseen stand-in of issue 19's CLI
check (`sweep +stage=1k`, then `+stage=8k`, with `workload.command=[python,tests/workloads/ridge.py]`).
Shape: grouped-GEMM efficiency rises with tokens per expert up to a knee (wide EP and CP starve the
experts); all-to-all grows with the log of the nodes an EP group spans, DeepEP trims it everywhere and
HybridEP more up to 4 nodes; each PP boundary costs a point-to-point hop per microbatch; the last stage
carries the head and MTP (a fixed extra share of compute, which deep pipelines feel most); CP's exchange
grows with its size; full recompute is dear, selective cheap; activations in flight follow 1F1B (the first
stage holds min(PP, m) microbatches of its layers) and interleaving adds to them.
Follows the workload contract (megatron_io.py); every line is marked SIMULATED. Capacity: RIDGE_HBM_GB
(default 141).

`evaluate(point)` is importable so the search benchmark reads the same surface in-process.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # megatron_io sits beside this script
import megatron_io  # noqa: E402

HBM_VAR, HBM_DEFAULT = "RIDGE_HBM_GB", 141.0
EXPERTS, TOP_K, LAYERS = 384, 6, 61
GEMM_KNEE = 1500.0  # tokens per expert at which grouped GEMMs reach half their headroom
# recompute: (compute factor, activations kept)
RECOMPUTE = {"none": (1.0, 1.0), "moe_act": (1.04, 0.8), "mhc+mla_up_proj": (1.08, 0.55), "full": (1.36, 0.2)}
OTHER = (1.06, 0.7)  # any other recompute set


def _recompute(p: megatron_io.Point, table=None) -> tuple[float, float]:
    """(compute factor, activations kept) of the layout's recompute set: this surface's, or another stand-in's
    (table, other) built on it (sibling.py)."""
    recompute, other = table or (RECOMPUTE, OTHER)
    return recompute.get(p.recompute, other)


def memory_gb(p: megatron_io.Point, table=None) -> float:
    """The first stage's rank: expert and dense states, and the activations 1F1B keeps in flight."""
    expert = 1520e9 / (p.pp * p.ep) * (4.0 + 12.0 / p.d_e)  # bf16 weight + fp32 grad; optimizer over D_e
    dense = 60e9 / p.pp * (4.0 + 12.0 / (p.d_a * p.cp))
    per_layer_mb = 0.9e9 * p.mbs * p.seq / 4096 / p.cp * _recompute(p, table)[1]
    return (expert + dense + per_layer_mb * p.layers_in_flight(LAYERS)) / 1e9 + 4.0


def step_time(p: megatron_io.Point, table=None) -> float:
    """Seconds per step on the ridge surface."""
    tokens = p.gbs * p.seq / p.n  # per GPU per step
    per_expert = p.ep * p.mbs * p.seq / p.cp * TOP_K / EXPERTS  # a GPU's experts' tokens per microbatch
    gemm = 1.0 + GEMM_KNEE / per_expert  # the grouped GEMM's slowdown below its knee
    compute = tokens * 6e-4 * (0.7 + 0.3 * gemm) * _recompute(p, table)[0]
    compute *= 1.0 + 0.07 * math.log2(p.cp)
    compute *= 1.0 + 0.9 / (LAYERS / p.pp)  # the last stage's head and MTP: almost a layer more of work
    span = -(-p.ep // p.gpus_per_node)
    a2a = tokens * 5e-4 * (0.5 if span <= 1 else 1.0 + 0.5 * math.log2(span))
    if p.dispatcher == "flex:hybridep":
        a2a *= 0.55 if span <= 4 else 0.85
    elif p.dispatcher.startswith("flex"):
        a2a *= 0.75
    p2p = 0.02 * p.vpp * p.m if p.pp > 1 else 0.0  # a stage's hops: one per chunk and microbatch
    bubble = (p.pp - 1) / (p.vpp * p.m + p.pp - 1)
    step = (compute + a2a + p2p) / (1.0 - bubble)
    return step + 4.0 * (1.0 - min(1.0, p.m / 12))  # gradient sync that few microbatches cannot hide


def evaluate(p: megatron_io.Point) -> tuple[float, float]:
    """(seconds per step, memory GB) of one layout."""
    return step_time(p), memory_gb(p)


def main(argv=None) -> int:
    banner = "ridge surface workload (tests/workloads/ridge.py)"
    return megatron_io.main(evaluate, banner, megatron_io.hbm_gb(HBM_VAR, HBM_DEFAULT), argv)


if __name__ == "__main__":
    sys.exit(main())
