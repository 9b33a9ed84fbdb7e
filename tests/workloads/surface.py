#!/usr/bin/env python3
"""An external stand-in for Megatron with a synthetic performance surface (NOT the twin).

Follows the workload contract (megatron_io.py): Megatron flags in, Megatron's iteration and memory lines
out (rank WORLD_SIZE-1 prints the iteration lines), or torch's CUDA OOM text and exit 1. Its surface
deliberately disagrees with the planner's analytic model (all-to-all far costlier across nodes, recompute
cheaper, a CP penalty, a sweet spot at EP 8, an exposed gradient sync that punishes PP 1), so the planner's
ranking is wrong and only measurements reveal the best layout.
Every line is marked SIMULATED: these are synthetic numbers.

`step_time(...)`, `memory_gb(...)` and `evaluate(point)` are importable so policy tests and the search
benchmark query the same surface in-process. Capacity: SURFACE_HBM_GB (default 80).
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # megatron_io sits beside this script
import megatron_io  # noqa: E402

HBM_VAR, HBM_DEFAULT = "SURFACE_HBM_GB", 80.0


def step_time(
    *,
    n: int,
    pp: int,
    vpp: int,
    cp: int,
    ep: int,
    mbs: int,
    gbs: int,
    seq: int,
    recompute: str,
    dispatcher: str,
    gpus_per_node: int = 8,
) -> float:
    """Seconds per step on the synthetic surface."""
    tp = 1
    d_a = max(1, n // (pp * cp * tp))
    m = max(1, gbs // (mbs * d_a))
    tokens_per_gpu = gbs * seq / n
    compute = tokens_per_gpu * 2e-5 * (0.88 if mbs >= 2 else 1.0)
    compute *= {"none": 1.0, "moe_act": 1.05, "full": 1.22}.get(recompute, 1.1)
    compute *= 1.0 + 0.12 * math.log2(cp)  # CP costs more than the planner thinks
    bubble = (pp - 1) / (vpp * m + pp - 1)
    crosses = ep * cp > gpus_per_node
    a2a = tokens_per_gpu * 1.5e-5 * (1.0 + 2.5 * math.log2(max(1, ep * cp / gpus_per_node)) if crosses else 0.3)
    if dispatcher.startswith("flex") and crosses:
        a2a *= 0.55
    if ep == 8:
        a2a *= 0.7  # the sweet spot the analytic model does not know
    p2p = 0.002 * (pp - 1) * vpp
    grad_sync = 0.12 / pp  # exposed DP gradient reduction of a stage's weights (the planner hides it)
    return (compute + a2a) / (1.0 - bubble) + p2p + grad_sync


def memory_gb(*, pp: int, ep: int, mbs: int, cp: int, recompute: str, seq: int) -> float:
    act = 6.0 * mbs * seq / 4096 / cp * {"none": 1.0, "moe_act": 0.8, "full": 0.35}.get(recompute, 0.8)
    weights = 40.0 / pp * (1.0 + 8.0 / ep)
    return 4.0 + act * min(pp, 4) + weights


def evaluate(p: megatron_io.Point) -> tuple[float, float]:
    """(seconds per step, memory GB) of one layout."""
    step = step_time(
        n=p.n,
        pp=p.pp,
        vpp=p.vpp,
        cp=p.cp,
        ep=p.ep,
        mbs=p.mbs,
        gbs=p.gbs,
        seq=p.seq,
        recompute=p.recompute,
        dispatcher=p.dispatcher,
        gpus_per_node=p.gpus_per_node,
    )
    return step, memory_gb(pp=p.pp, ep=p.ep, mbs=p.mbs, cp=p.cp, recompute=p.recompute, seq=p.seq)


def main(argv=None) -> int:
    banner = "synthetic surface workload (tests/workloads/surface.py)"
    return megatron_io.main(evaluate, banner, megatron_io.hbm_gb(HBM_VAR, HBM_DEFAULT), argv)


if __name__ == "__main__":
    sys.exit(main())
