"""Benchmark: parse a realistic ~100 MB Megatron last-rank log; the goal is < 3 s.

The log mixes what a 16k-GPU job's last rank prints per iteration: the iteration line with every
optional field, an INFO-prefixed (min, max) timer block at --timing-log-level 2, a memory line every
10 iterations, a straggler line, plus noise (NCCL INFO, warnings) under `srun -l` prefixes.
Parsed as orchestrator.evidence.collect parses a job's file: the 1k stage's window and the checkpoint timers kept
(orchestrator.evidence.keep;
the parser's memory is bench_parse_memory's subject). Generated once into a temp dir (cached between runs).
Run: .venv/bin/python tests/bench/bench_parse.py
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.evidence.keep import Keep  # noqa: E402
from orchestrator.evidence.parse import parse_file  # noqa: E402

GOAL_S = 3.0
KEEP = Keep(window=(20, 30), timers=("save-checkpoint", "load-checkpoint"))  # the 1k stage's window
TARGET_MB = 100
TIMERS = [
    "forward-backward",
    "forward-compute",
    "backward-compute",
    "batch-generator",
    "forward-recv",
    "forward-send",
    "backward-recv",
    "backward-send",
    "forward-send-backward-recv",
    "backward-send-forward-recv",
    "layernorm-grads-all-reduce",
    "embedding-grads-all-reduce",
    "all-grads-sync",
    "params-all-gather",
    "optimizer-copy-to-main-grad",
    "optimizer-unscale-and-check-inf",
    "optimizer-clip-main-grad",
    "optimizer-count-zeros",
    "optimizer-inner-step",
    "optimizer-copy-main-to-model-params",
    "optimizer",
]


def _iteration_block(it: int, rng: random.Random, last: int) -> str:
    ms = 9000 + rng.random() * 500
    p = f"{last}: "
    lines = [
        f"{p} [2026-11-29 10:{it // 60 % 60:02d}:{it % 60:02d}.123456] iteration {it:8d}/{10**6:8d} |"
        f" consumed samples: {it * 4096:12d} | skipped samples: {0:12d} |"
        f" elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {400 + rng.random():.1f} |"
        f" energy per GPU (J/iter/GPU): {ms * 0.7:.1f} | power per GPU (W/GPU): 700.0 |"
        f" learning rate: {3e-4:.6E} | global batch size:  4096 | lm loss: {2 + rng.random():.6E} |"
        f" mtp_1 loss: {2.1 + rng.random():.6E} | seq_load_balancing_loss: 1.01 | loss scale: 1.0 |"
        f" grad norm: {rng.random():.3f} | num zeros: 0 | params norm: 1234.567 |"
        f" number of skipped iterations:   0 | number of nan iterations:   0 |",
        f"{p}INFO:megatron.core.timers:(min, max) time across ranks (ms):",
    ]
    for name in TIMERS:
        lo = rng.random() * 100
        lines.append(f"{p}    {(name + ' ').ljust(48, '.')}: ({lo:.2f}, {lo * 1.1:.2f})")
    if it % 10 == 0:
        lines.append(
            f"{p}[Rank {last}] (after {it} iterations) memory (MB) | allocated: 60123.45 |"
            " max allocated: 70234.56 | reserved: 72000.00 | max reserved: 74000.00"
        )
        lines.append(
            "0: INFO:megatron.core.utils:[2026-11-29 10:00:00] | MnRtt/Rnk: 8900.12ms/5 |"
            " MxRtt/Rnk: 9120.88ms/61 | MnPwr/Rnk: 640.00W/2 | MxPwr/Rnk: 700.00W/61 |"
            " MnEtpt/Rnk: 398.40TF/61 | MxEtpt/Rnk: 404.90TF/5"
        )
    for _ in range(8):
        r = rng.randrange(last)
        lines.append(f"{r}: n{r // 8}:12345:12399 [{r % 8}] NCCL INFO Channel 03/0 : {r} -> {r + 1} via P2P/IPC/read")
    return "\n".join(lines) + "\n"


def make_log(folder: Path, target_mb: int = TARGET_MB) -> Path:
    path = folder / f"bench-rank-last-{target_mb}mb.out"
    if path.exists() and path.stat().st_size >= target_mb * 1_000_000:
        return path
    rng = random.Random(0)
    with open(path, "w") as f:
        size, it = 0, 1
        while size < target_mb * 1_000_000:
            block = _iteration_block(it, rng, 16383)
            f.write(block)
            size += len(block)
            it += 1
    return path


def main() -> bool:
    """Print the figures; True when the goal is met (tests/bench/run_all.py convention)."""
    folder = Path(os.environ.get("BENCH_DIR", Path(tempfile.gettempdir()) / "dsv4-bench-parse"))
    folder.mkdir(parents=True, exist_ok=True)
    path = make_log(folder)
    mb = path.stat().st_size / 1e6
    best = cpu = full = float("inf")
    log = None
    for _ in range(2):
        t0, c0 = time.perf_counter(), time.process_time()
        log = parse_file(path, keep=KEEP)
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
        t1 = time.perf_counter()
        rows = sum(len(b.timers) for b in log.timers)  # the kept blocks' values are decoded on first access
        full = min(full, best + time.perf_counter() - t1)
    assert log is not None and log.iterations and log.timers and log.memory and rows
    print(
        f"parse_file: {mb:.1f} MB in {best:.2f} s wall ({cpu:.2f} s CPU) = {mb / best:.1f} MB/s "
        f"({log.lines} lines; {len(log.iterations)} iterations and {len(log.timers)} timer blocks kept); "
        f"goal < {GOAL_S:.1f} s: {'PASS' if best < GOAL_S else 'MISS'}"
    )
    print(
        f"parse_file + decoding the kept {rows} timer rows: {full:.2f} s wall = {mb / full:.1f} MB/s; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall time counts contention)"
    )
    return best < GOAL_S


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
