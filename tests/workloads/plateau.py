#!/usr/bin/env python3
"""An external stand-in for Megatron with a plateau surface (NOT the twin, NOT surface.py, cliffs.py or ridge.py).

Written after the search's defaults were tuned, and after the stand-in memory-line fix that ridge.py's sweep
found; never tuned on: issue 19's unseen CLI check. Shape: attention grows with the sequence a rank holds,
so CP relieves it while its ring exchange costs a share of it; grouped GEMMs reach their plateau early (a knee at
800 tokens per expert, micro-batch 2 a little faster still); all-to-all is the share of tokens that leave the
node, DeepEP trims it everywhere and HybridEP halves it within two nodes but is worse beyond; each extra
virtual stage costs a launch overhead that deep pipelines feel; a gradient sync that fewer than 8 microbatches
cannot hide. Memory: fp32 master weights sharded over the data-parallel groups, 1F1B activations in flight.
Follows the workload contract (megatron_io.py); every line is marked SIMULATED. Capacity: PLATEAU_HBM_GB
(default 141).

`evaluate(point)` is importable so the search benchmark reads the same surface in-process.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # megatron_io sits beside this script
import megatron_io  # noqa: E402

HBM_VAR, HBM_DEFAULT = "PLATEAU_HBM_GB", 141.0
EXPERTS, TOP_K, LAYERS = 384, 6, 61
GEMM_KNEE = 800.0
# recompute: (compute factor, activations kept)
RECOMPUTE = {"none": (1.0, 1.0), "moe_act": (1.03, 0.7), "mhc+mla_up_proj": (1.05, 0.6), "full": (1.3, 0.15)}


def _recompute(p: megatron_io.Point) -> tuple[float, float]:
    return RECOMPUTE.get(p.recompute, (1.05, 0.65))


def memory_gb(p: megatron_io.Point) -> float:
    """The first PP stage's DP-rank 0 (its one figure, megatron_io): states and the activations in flight."""
    expert = 1600e9 / (p.pp * p.ep) * (4.0 + 12.0 / p.d_e)  # bf16 weights and grads; fp32 master and Adam over D_e
    dense = 50e9 / p.pp * (4.0 + 12.0 / (p.d_a * p.cp))
    per_layer_mb = 1.6e9 * p.mbs * p.seq / 8192 / p.cp * _recompute(p)[1]
    return (expert + dense + per_layer_mb * p.layers_in_flight(LAYERS)) / 1e9 + 6.0


def step_time(p: megatron_io.Point) -> float:
    """Seconds per step on the plateau surface."""
    tokens = p.gbs * p.seq / p.n  # per GPU per step
    per_expert = p.ep * p.mbs * p.seq / p.cp * TOP_K / EXPERTS
    gemm = 1.0 + (GEMM_KNEE / per_expert) ** 1.5
    mlp = tokens * 5e-4 * (0.75 + 0.25 * gemm) * (0.92 if p.mbs >= 2 else 1.0)
    attention = tokens * 2e-4 * (p.seq / p.cp) / 8192
    cp_ring = attention * 0.3 * (p.cp - 1) / p.cp
    compute = (mlp + attention + cp_ring) * _recompute(p)[0]
    span = -(-p.ep // p.gpus_per_node)
    a2a = tokens * 4e-4 * (0.3 + 0.7 * (1.0 - 1.0 / span)) * (1.0 + 0.1 * math.log2(span))
    if p.dispatcher == "flex:hybridep":
        a2a *= 0.5 if span <= 2 else 1.1
    elif p.dispatcher.startswith("flex"):
        a2a *= 0.7
    bubble = (p.pp - 1) / (p.vpp * p.m + p.pp - 1)
    step = (compute + a2a) / (1.0 - bubble) * (1.0 + 0.01 * (p.vpp - 1) * p.pp / 4)
    return step + 3.0 * (1.0 - min(1.0, p.m / 8))


def evaluate(p: megatron_io.Point) -> tuple[float, float]:
    """(seconds per step, memory GB) of one layout."""
    return step_time(p), memory_gb(p)


def main(argv=None) -> int:
    banner = "plateau surface workload (tests/workloads/plateau.py)"
    return megatron_io.main(evaluate, banner, megatron_io.hbm_gb(HBM_VAR, HBM_DEFAULT), argv)


if __name__ == "__main__":
    sys.exit(main())
