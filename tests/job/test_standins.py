"""The `workload.command` stand-ins (tests/workloads/*.py) keep the workload contract (docs/workload.md): run as a
job runs them, with Megatron flags, the last rank's iteration lines and the SIMULATED marker parse as Megatron's,
at the step their importable `evaluate` gives, and their one memory figure as rank 0's line (the first stage's,
the heaviest); a layout over their capacity prints torch's OOM text and exits 1."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.evidence.parse import parse_bytes

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
FLAGS = [
    "--pipeline-model-parallel-size=8",
    "--context-parallel-size=2",
    "--expert-model-parallel-size=32",
    "--micro-batch-size=1",
    "--global-batch-size=4096",
    "--seq-length=8192",
    "--train-iters=6",
    "--recompute-granularity=full",
]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"standin_{name}", WORKLOADS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(name: str, flags: list[str], hbm: str | None = None, **rank_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORLD_SIZE": "1024", "RANK": "1023"}
    env.pop("ORCH_SINGLE_PROCESS", None)
    env.update(rank_env)
    if hbm is not None:
        env[_load(name).HBM_VAR] = hbm
    cmd = [sys.executable, str(WORKLOADS / f"{name}.py"), *flags]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=120, check=False)


@pytest.mark.parametrize("name", ["surface", "cliffs", "ridge", "plateau", "sibling"])
def test_a_stand_in_speaks_megatron_at_its_own_step(name):
    mod, mega = _load(name), sys.modules["megatron_io"]
    point, iters = mega.point_from_argv(FLAGS, 1024)
    step, mem = mod.evaluate(point)
    proc = _run(name, FLAGS, hbm=str(mem + 10), ORCH_SINGLE_PROCESS="1")  # a local job: one process, every rank
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    log = parse_bytes(proc.stdout)
    assert log.simulated_markers and len(log.iterations) == iters == 6
    # its one memory figure is the first stage's (the heaviest under 1F1B): rank 0's line, never the last rank's
    assert [(r.rank, round(r.max_reserved * 2**20 / 1e9, 3)) for r in log.memory] == [(0, round(mem, 3))]
    for rank, lines in (("1023", 0), ("0", 1)):  # one process per rank (Slurm, a rank probe): rank 0 prints it
        alone = parse_bytes(_run(name, [*FLAGS, "--fake-process-group"], hbm=str(mem + 10), RANK=rank).stdout)
        assert len(alone.memory) == lines and all(r.rank == 0 for r in alone.memory)
    times = sorted(r.elapsed_ms / 1e3 for r in log.iterations)
    assert times[len(times) // 2] == pytest.approx(step, rel=0.02)
    over = _run(name, FLAGS, hbm=str(mem - 1))  # a GPU one GB short of what the layout needs
    assert over.returncode == 1 and parse_bytes(over.stderr).ooms
