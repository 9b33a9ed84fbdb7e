"""Planner speed: the full 16k stage (>= 20k raw layouts) must plan in < 1 s (best of 3).

The goal is judged on the process's CPU time (time.process_time): the build machine is shared, and
wall time there measures the neighbours' load as much as the planner. Both are printed.
"""

from __future__ import annotations

import time

GOAL_S = 1.0
MIN_RAW = 20_000


def main() -> bool:
    from orchestrator.config import compose
    from orchestrator.plan.planner import plan

    cfg = compose(["+stage=16k"]).cfg
    wall, cpu, res = [], [], None
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        res = plan(cfg.model, cfg.hardware, cfg.stage)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    assert res is not None
    best = min(cpu)
    ok = best < GOAL_S and res.raw_count >= MIN_RAW
    print(f"   plan +stage=16k ({cfg.hardware.name}): raw candidates {res.raw_count}, legal {len(res.candidates)}")
    print(
        f"   best of 3: {best:.3f} s CPU ({', '.join(f'{t:.3f}' for t in cpu)}), "
        f"wall {min(wall):.3f} s ({', '.join(f'{t:.3f}' for t in wall)}); {res.raw_count / best:,.0f} candidates/s"
    )
    print(f"   goal: < {GOAL_S:.1f} s CPU for >= {MIN_RAW:,} raw -> {'met' if ok else 'MISSED'}")
    return ok


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
