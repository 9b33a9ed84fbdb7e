"""Benchmark: the parser's peak memory does not grow with the log (goal: flat from 100 MB to 2 GB).

Each log is generated in a temp dir, parsed in a child process the way orchestrator.evidence.collect parses a job's
files
(the spec's window, the checkpoint timers), and deleted. The child reports its peak RSS (VmHWM) and wall
time. Logs: Megatron's last-rank output (iteration line, timer block, memory and straggler lines, NCCL noise)
at 100 MB and 2 GB; one 2 GB line without a newline (with a traceback's exception in its head and a CUDA OOM
line after it); 1 GB of `\\r`-only progress output. Goal: every peak within 1.25x (+16 MB) of the 100 MB
Megatron log's, and that one under 512 MB.
Sizes: BENCH_PARSE_MEMORY_MB="megatron=100,2000;line=2000;progress=1000" (smaller for a quick look).
Run: .venv/bin/python tests/bench/bench_parse_memory.py
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_parse import TIMERS  # noqa: E402

SIZES = os.environ.get("BENCH_PARSE_MEMORY_MB", "megatron=100,2000;line=2000;progress=1000")
WINDOW = (20, 30)  # the 1k stage's warm-up and measured iterations
FLAT = 1.25  # peak RSS at any size / peak RSS of the smallest Megatron log
SLACK_MB = 16.0
CEILING_MB = 512.0
BATCH = 8 << 20

CHILD = """
import json, sys, time
from orchestrator.evidence.keep import Keep
from orchestrator.evidence.parse import parse_file
t0 = time.perf_counter()
log = parse_file(sys.argv[1], keep=Keep(window=(int(sys.argv[2]), int(sys.argv[3])), timers=("save-checkpoint",)))
wall = time.perf_counter() - t0
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"wall_s": wall, "peak_mb": hwm / 1024, "iterations": len(log.iterations), "timers": len(log.timers),
                  "ooms": len(log.ooms), "tracebacks": len(log.tracebacks), "lines": log.lines,
                  "long_lines": log.long_lines, "dropped": log.dropped}))
"""


def _megatron_bodies(n: int = 500) -> list[str]:
    """What follows the iteration line of one iteration (timer block, memory/straggler lines, noise)."""
    rng = random.Random(0)
    last = 16383
    out = []
    for it in range(1, n + 1):
        p = f"{last}: "
        lines = [f"{p}INFO:megatron.core.timers:(min, max) time across ranks (ms):"]
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
                " MxRtt/Rnk: 9120.88ms/61 | MnEtpt/Rnk: 398.40TF/61 | MxEtpt/Rnk: 404.90TF/5"
            )
        for _ in range(8):
            r = rng.randrange(last)
            lines.append(f"{r}: n{r // 8}:12345:12399 [{r % 8}] NCCL INFO Channel 03/0 : {r} -> {r + 1} via P2P/IPC")
        out.append("\n".join(lines) + "\n")
    return out


ITERATION = (
    "16383:  [2026-11-29 10:00:00.123456] iteration %8d/ 1000000 | consumed samples: %12d |"
    " elapsed time per iteration (ms): 9%03d.5 | throughput per GPU (TFLOP/s/GPU): 400.1 |"
    " learning rate: 3.000000E-04 | global batch size:  4096 | lm loss: 2.123456E+00 | mtp_1 loss: 2.2E+00 |"
    " loss scale: 1.0 | grad norm: 0.512 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
)


def make_megatron(path: Path, mb: int) -> None:
    bodies = _megatron_bodies()
    with open(path, "w") as f:
        size, it = 0, 1
        while size < mb * 1_000_000:
            parts, n = [], 0
            while n < BATCH:
                s = ITERATION % (it, it * 4096, it % 1000) + bodies[it % len(bodies)]
                parts.append(s)
                n += len(s)
                it += 1
            f.write("".join(parts))
            size += n


def make_long_line(path: Path, mb: int) -> None:
    block = b"0123456789abcdef" * (BATCH // 16)
    with open(path, "wb") as f:
        f.write(b"[rank0]: RuntimeError: cannot print tensor of shape (65536, 65536): ")
        for _ in range(mb * 1_000_000 // len(block)):
            f.write(block)
        f.write(b"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


def make_progress(path: Path, mb: int) -> None:
    bar = b"".join(b"\rLoading shards %5d/99999 [%-40s] %3d%%" % (i, b"#" * (i % 40), i % 100) for i in range(2000))
    with open(path, "wb") as f:
        for _ in range(mb * 1_000_000 // len(bar)):
            f.write(bar)
        f.write(b"\n")


def _sizes() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for part in SIZES.split(";"):
        kind, _, mbs = part.partition("=")
        out[kind.strip()] = [int(x) for x in mbs.split(",") if x.strip()]
    return out


def measure(folder: Path, kind: str, mb: int, make: Callable[[Path, int], None]) -> dict:
    path = folder / f"{kind}-{mb}mb.log"
    t0 = time.perf_counter()
    make(path, mb)
    gen = time.perf_counter() - t0
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), *map(str, WINDOW)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"parsing {path.name} failed: {proc.stderr[-2000:]}")
        got = json.loads(proc.stdout)
    finally:
        path.unlink(missing_ok=True)
    got.update(kind=kind, mb=mb, gen_s=gen)
    print(
        f"{kind:9s} {mb:5d} MB: peak RSS {got['peak_mb']:6.1f} MB, parsed in {got['wall_s']:5.1f} s "
        f"({got['iterations']} iterations, {got['timers']} timer blocks kept, {got['dropped']} records dropped, "
        f"{got['long_lines']} long lines, {got['lines']} lines; generated in {gen:.1f} s)",
        flush=True,
    )
    return got


def main() -> bool:
    """Print the figures; True when the goal is met (tests/bench/run_all.py convention)."""
    makers = {"megatron": make_megatron, "line": make_long_line, "progress": make_progress}
    folder = Path(tempfile.mkdtemp(prefix="dsv4-bench-parse-memory-"))
    try:
        rows = [measure(folder, kind, mb, makers[kind]) for kind, mbs in _sizes().items() for mb in mbs]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    base = min((r for r in rows if r["kind"] == "megatron"), key=lambda r: r["mb"])
    limit = base["peak_mb"] * FLAT + SLACK_MB
    worst = max(rows, key=lambda r: r["peak_mb"])
    ok = base["peak_mb"] < CEILING_MB and worst["peak_mb"] <= limit
    checks = [r for r in rows if r["kind"] == "line"]
    ok = ok and all(r["ooms"] == 1 and r["tracebacks"] >= 1 and r["long_lines"] == 1 for r in checks)
    print(
        f"peak RSS: {base['peak_mb']:.1f} MB at {base['mb']} MB of Megatron log, at most {worst['peak_mb']:.1f} MB "
        f"({worst['kind']}, {worst['mb']} MB); goal <= {limit:.1f} MB ({FLAT}x + {SLACK_MB:.0f} MB) and "
        f"< {CEILING_MB:.0f} MB: {'PASS' if ok else 'MISS'}"
    )
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
