#!/usr/bin/env python3
"""An external stand-in for Megatron with a synthetic performance surface (NOT the twin).

Follows the workload contract: it is started as `<command> <Megatron flags>` with torchrun-style rank env
(RANK, WORLD_SIZE) and ORCH_JOB_SPEC; it prints Megatron's iteration and memory lines (rank WORLD_SIZE-1
prints the iteration lines), or torch's CUDA OOM text and exit 1. Its surface deliberately disagrees with
the planner's analytic model (all-to-all far costlier across nodes, recompute cheaper, a CP penalty, a
sweet spot at EP 8, an exposed gradient sync that punishes PP 1), so the planner's ranking is wrong
and only measurements reveal the best layout.
Every line is marked SIMULATED: these are synthetic numbers.

`step_time(...)` is importable so policy tests can query the same surface in-process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import datetime

HBM_GB = float(os.environ.get("SURFACE_HBM_GB", "80"))


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


def _flags(argv):
    p = argparse.ArgumentParser(add_help=False)
    for name, typ, default in (
        ("pipeline-model-parallel-size", int, 1),
        ("context-parallel-size", int, 1),
        ("expert-model-parallel-size", int, 1),
        ("micro-batch-size", int, 1),
        ("global-batch-size", int, 1),
        ("seq-length", int, 4096),
        ("train-iters", int, 10),
        ("moe-token-dispatcher-type", str, "alltoall"),
        ("moe-flex-dispatcher-backend", str, ""),
    ):
        p.add_argument(f"--{name}", type=typ, default=default)
    p.add_argument("--recompute-modules", nargs="*", default=[])
    p.add_argument("--recompute-granularity", default=None)
    args, _ = p.parse_known_args(argv)
    return args


def main(argv=None) -> int:
    a = _flags(sys.argv[1:] if argv is None else argv)
    n = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    vpp = 1
    spec_path = os.environ.get("ORCH_JOB_SPEC")
    if spec_path and os.path.exists(spec_path):  # VPP is written in the layer pattern; the spec says it plainly
        vpp = int(json.load(open(spec_path)).get("layout", {}).get("vpp", 1))
    recompute = "full" if a.recompute_granularity == "full" else ("+".join(a.recompute_modules) or "none")
    disp = a.moe_token_dispatcher_type
    if disp == "flex":
        disp += f":{a.moe_flex_dispatcher_backend}"
    print("[SIMULATED] synthetic surface workload (tests/workloads/surface.py)", flush=True)
    mem = memory_gb(
        pp=a.pipeline_model_parallel_size,
        ep=a.expert_model_parallel_size,
        mbs=a.micro_batch_size,
        cp=a.context_parallel_size,
        recompute=recompute,
        seq=a.seq_length,
    )
    if mem > HBM_GB:
        print(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {rank} has a total "
            f"capacity of {HBM_GB:.2f} GiB of which 0 bytes is free.",
            file=sys.stderr,
            flush=True,
        )
        return 1
    st = step_time(
        n=n,
        pp=a.pipeline_model_parallel_size,
        vpp=vpp,
        cp=a.context_parallel_size,
        ep=a.expert_model_parallel_size,
        mbs=a.micro_batch_size,
        gbs=a.global_batch_size,
        seq=a.seq_length,
        recompute=recompute,
        dispatcher=disp,
    )
    last = rank == n - 1
    for it in range(1, a.train_iters + 1):
        time.sleep(0.001)
        if last:
            ts = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
            wobble = 1.0 + 0.01 * math.sin(it * 1.7)
            print(
                f" [{ts}] iteration {it:8d}/{a.train_iters:8d} | consumed samples: {it * a.global_batch_size:12d} |"
                f" elapsed time per iteration (ms): {st * wobble * 1000:.1f} | learning rate: 1.000000E-04 |"
                f" global batch size: {a.global_batch_size:5d} | lm loss: {8.0 / math.sqrt(it):.6E} |"
                f" loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 |"
                f" number of nan iterations:   0 |",
                flush=True,
            )
        if it == 1:
            mb = mem * 1e9 / 2**20
            print(
                f"[Rank {rank}] (after 1 iterations) memory (MB) | allocated: {mb * 0.8:.2f} | max allocated: "
                f"{mb * 0.95:.2f} | reserved: {mb:.2f} | max reserved: {mb:.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
