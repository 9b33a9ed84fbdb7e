"""Benchmark: collect a synthetic 16k-GPU job folder; the goal is < 5 s on this 2-core machine.

The folder is what a 16,384-rank real job (TP1 PP16 EP64, 2,048 nodes) leaves since only evidence ranks
(orchestrator.plan.ranks.evidence_ranks) keep files of their own: the last rank's iteration lines, timer
blocks and memory lines over 50 iterations, memory lines of each PP stage's DP-rank-0 rank, one sidecar
per evidence rank (384 experts' token counts), and one node log per node with the other ranks' labelled
warnings. Before, the same job left three files per rank (49,152) and collect read them all.
Run: .venv/bin/python tests/bench/bench_collect.py
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.core.paths import JobPaths  # noqa: E402
from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig, WorkloadConfig  # noqa: E402
from orchestrator.core.spec import JobSpec  # noqa: E402
from orchestrator.evidence.collect import collect  # noqa: E402
from orchestrator.plan import ranks  # noqa: E402
from orchestrator.plan.layout import Layout  # noqa: E402

GOAL_S = 5.0
N, PER_NODE, EXPERTS = 16384, 8, 384
LAYOUT = Layout(tp=1, pp=16, cp=1, ep=64, etp=1, mbs=1)
WARMUP, MEASURE = 20, 30
NODE_LINES_PER_RANK = 20  # warnings every rank prints at start-up (deprecations, NCCL INFO)


def iteration_line(it: int, ms: float) -> str:
    return (
        f" [2026-11-29 10:{it // 60:02d}:{it % 60:02d}.000000] iteration {it:8d}/{WARMUP + MEASURE:8d} | "
        f"consumed samples: {it * 4096:12d} | elapsed time per iteration (ms): {ms:.1f} | "
        f"learning rate: 1.000000E-04 | global batch size: 4096 | lm loss: {3.0 - it * 0.01:.6E} | "
        "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations: 0 | number of nan iterations: 0 |\n"
    )


def memory_line(rank: int, it: int) -> str:
    return (
        f"[Rank {rank}] (after {it} iterations) memory (MB) | allocated: 60123.45 | max allocated: 70234.56 | "
        "reserved: 72000.00 | max reserved: 74000.00\n"
    )


def make_folder(root: Path) -> tuple[Path, int]:
    """The synthetic job folder (rebuilt when missing) and how many files it holds."""
    folder = root / f"job-{N}"
    paths = JobPaths(folder)
    if paths.spec.exists():
        return folder, sum(1 for _ in folder.iterdir())
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    JobSpec(
        sweep="bench",
        candidate_key="k16k",
        attempt=1,
        layout=LAYOUT.to_dict(),
        model=ModelConfig(),
        stage=StageConfig(name="16k", gpus=N, warmup_iters=WARMUP, measure_iters=MEASURE),
        hardware=HardwareConfig(),
        workload=WorkloadConfig(name="megatron", simulated=False),
        job_dir=str(folder),
        n_gpus=N,
        gpus_per_node=PER_NODE,
    ).save(paths.spec)
    evidence = ranks.evidence_ranks(LAYOUT, N)
    timers = "".join(f"    {name} ......: ({rng.uniform(1, 9):.2f}, {rng.uniform(9, 20):.2f})\n" for name in "abcdefgh")
    last = []
    for it in range(1, WARMUP + MEASURE + 1):
        last.append(iteration_line(it, 6000 + rng.gauss(0, 50)))
        last.append("INFO:megatron.core.timers:(min, max) time across ranks (ms):\n" + timers)
    paths.stdout(N - 1).write_text("".join(last))
    for r in evidence:
        c = ranks.coords(LAYOUT, N, r)
        if r != N - 1:
            mem = [memory_line(r, it) for it in (1, 10, 20)] if c["dp"] == 0 else []
            paths.stdout(r).write_text("".join(mem))
        paths.stderr(r).write_text("UserWarning: a deprecation every rank prints\n")
        doc = {
            "simulated": False,
            "rank": r,
            "pp_stage": c["pp"],
            "peak_allocated_mb": 70000.0 + rng.uniform(0, 5000),
            "peak_reserved_mb": 76000.0 + rng.uniform(0, 3000),
            "tokens_per_expert": [rng.randint(9000, 13000) for _ in range(EXPERTS)],
            "routed_tokens": 4_194_304,
            "dropped_tokens": 0,
            "padded_tokens": 0,
        }
        paths.sidecar(r).write_text(json.dumps(doc))
    for node in range(N // PER_NODE):
        quiet = [r for r in range(node * PER_NODE, (node + 1) * PER_NODE) if r not in evidence]
        lines = [f"{r}: UserWarning: warning {i} of rank {r}\n" for r in quiet for i in range(NODE_LINES_PER_RANK)]
        paths.node_log(f"gpu{node:04d}").write_text("".join(lines))
    return folder, sum(1 for _ in folder.iterdir())


def main() -> bool:
    """Print the figures; True when the goal is met (tests/bench/run_all.py convention)."""
    root = Path(os.environ.get("BENCH_DIR", Path(tempfile.gettempdir()) / "dsv4-bench-collect"))
    t0 = time.perf_counter()
    folder, files = make_folder(root)
    built = time.perf_counter() - t0
    best = float("inf")
    result = None
    for _ in range(2):
        t1 = time.perf_counter()
        result = collect(folder, slurm_state="COMPLETED", exit_code=0)
        best = min(best, time.perf_counter() - t1)
    assert result is not None and result.ok and result.measure_iters == MEASURE, result
    print(
        f"collect of a {N}-rank job folder: {best:.2f} s wall ({files} files, was {3 * N} with files per rank; "
        f"folder built in {built:.1f} s); goal < {GOAL_S:.0f} s: {'PASS' if best < GOAL_S else 'MISS'}"
    )
    return best < GOAL_S


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
