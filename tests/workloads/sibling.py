#!/usr/bin/env python3
"""An external stand-in for Megatron where the optimum sits one recompute knob from a slower sibling (NOT the twin,
NOT surface.py, cliffs.py, ridge.py or plateau.py).

Written for issue 48 and never tuned on (held out in tests/bench/bench_search.py): ridge.py's shape, except that
selective recompute frees little memory (moe_act keeps 96% of the activations, where the planner's model charges
tens of GB for dropping it) and costs 5% of compute, so the no-recompute optimum fits a little under the GPU and
its moe_act sibling, which the model prefers, is about 3% slower. Capacity: SIBLING_HBM_GB.
Ridge's shape: grouped-GEMM efficiency rises with tokens per expert up to a knee (wide EP and CP starve the
experts); all-to-all grows with the log of the nodes an EP group spans, DeepEP trims it everywhere and
HybridEP more up to 4 nodes; each PP boundary costs a point-to-point hop per microbatch; the last stage
carries the head and MTP (a fixed extra share of compute, which deep pipelines feel most); CP's exchange
grows with its size; full recompute is dear, selective cheap; activations in flight follow 1F1B (the first
stage holds min(PP, m) microbatches of its layers) and interleaving adds to them.
Follows the workload contract (megatron_io.py); every line is marked SIMULATED.

`evaluate(point)` is importable so the search benchmark reads the same surface in-process.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # megatron_io and ridge sit beside this script
import megatron_io  # noqa: E402
import ridge  # noqa: E402

HBM_VAR, HBM_DEFAULT = "SIBLING_HBM_GB", 133.0  # the optimum a little under it
# recompute: (compute factor, activations kept); ridge.py's surface with this table
RECOMPUTE = {"none": (1.0, 1.0), "moe_act": (1.05, 0.96), "mhc+mla_up_proj": (1.08, 0.9), "full": (1.36, 0.2)}
TABLE = (RECOMPUTE, (1.06, 0.85))


def evaluate(p: megatron_io.Point) -> tuple[float, float]:
    """(seconds per step, memory GB) of one layout: ridge.py's surface, this file's recompute."""
    return ridge.step_time(p, TABLE), ridge.memory_gb(p, TABLE)


def main(argv=None) -> int:
    banner = "sibling surface workload (tests/workloads/sibling.py)"
    return megatron_io.main(evaluate, banner, megatron_io.hbm_gb(HBM_VAR, HBM_DEFAULT), argv)


if __name__ == "__main__":
    sys.exit(main())
