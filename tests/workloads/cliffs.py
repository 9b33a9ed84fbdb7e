#!/usr/bin/env python3
"""An external stand-in for Megatron whose surface has cliffs (NOT the twin, NOT surface.py).

Shape: all-to-all cost jumps when the EP group leaves its node and then grows with the square root of the
nodes it spans; HybridEP hides and shrinks it up to 4 nodes and collapses beyond, DeepEP helps less but
everywhere; interleaving (VPP) costs a little per extra chunk; first-stage activations are one whole-model
microbatch (1F1B) times the interleaving penalty, so PP does not relieve them; and a layout within 10% of
HBM slows down (allocator retries), so the fastest layout that fits is not the one closest to the limit.
Follows the workload contract (megatron_io.py); every line is marked SIMULATED. Capacity: CLIFFS_HBM_GB
(default 141).

`evaluate(point)` is importable so the search benchmark reads the same surface in-process.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # megatron_io sits beside this script
import megatron_io  # noqa: E402

HBM_VAR, HBM_DEFAULT = "CLIFFS_HBM_GB", 141.0
RECOMPUTE = {"none": (1.0, 1.0), "moe_act": (1.03, 0.85), "mhc+mla_up_proj": (1.06, 0.6), "full": (1.3, 0.22)}


def memory_gb(p: megatron_io.Point) -> float:
    """Heaviest (first) stage: expert and dense state, one whole-model microbatch of activations."""
    expert = 1550e9 / (p.pp * p.ep) * (6.0 + 8.0 / p.d_e)  # bf16 weight + fp32 grad, optimizer state over D_e
    dense = 45e9 / p.pp * (6.0 + 8.0 / (p.d_a * p.cp))
    act = 21e9 * p.mbs * p.seq / 8192 / p.cp * RECOMPUTE.get(p.recompute, (1.1, 0.8))[1] * p.interleaving
    return (expert + dense + act) / 1e9 + 5.0


def step_time(p: megatron_io.Point, hbm: float) -> float:
    """Seconds per step on the cliff surface (memory pressure read against `hbm`)."""
    tokens = p.gbs * p.seq / p.n
    compute = tokens * 1.6e-5 * (0.9 if p.mbs >= 2 else 1.0) * RECOMPUTE.get(p.recompute, (1.1, 0.8))[0]
    compute *= 1.0 + 0.04 * math.log2(p.cp)
    span = -(-p.ep // p.gpus_per_node)
    a2a = tokens * 1.2e-5 * (0.35 if span <= 1 else 2.2 * math.sqrt(span))
    if p.dispatcher == "flex:hybridep" and span > 1:
        a2a *= 0.45 * 0.6 if span <= 4 else 0.9  # shrinks and is 40% hidden, until it collapses
    elif p.dispatcher.startswith("flex") and span > 1:
        a2a *= 0.6
    bubble = (p.pp - 1) / (p.vpp * p.m + p.pp - 1)
    step = (compute + a2a) / (1.0 - bubble) * (1.0 + 0.006 * (p.vpp - 1) * p.pp)
    step += 0.4 * 45.0 / p.pp / 50.0 * (1.0 - min(1.0, p.m / 16))  # gradient sync that few microbatches cannot hide
    pressure = memory_gb(p) / hbm
    return step * (1.0 + 2.0 * max(0.0, pressure - 0.9))


def evaluate(p: megatron_io.Point, hbm: float | None = None) -> tuple[float, float]:
    """(seconds per step, memory GB) of one layout."""
    hbm = megatron_io.hbm_gb(HBM_VAR, HBM_DEFAULT) if hbm is None else hbm
    return step_time(p, hbm), memory_gb(p)


def main(argv=None) -> int:
    banner = "cliff surface workload (tests/workloads/cliffs.py)"
    return megatron_io.main(evaluate, banner, megatron_io.hbm_gb(HBM_VAR, HBM_DEFAULT), argv)


if __name__ == "__main__":
    sys.exit(main())
