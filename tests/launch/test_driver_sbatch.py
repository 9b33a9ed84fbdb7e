"""scripts/driver.sbatch (issue 21): the sweep driver as a small Slurm job, submitted on the local cluster with a
one-GPU sweep; it drives the sweep to its end from a compute node and leaves the result in the ledger."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import FAST_TWIN, ROOT, ledger_url, wait_for

pytestmark = pytest.mark.slurm
SCRIPT = ROOT / "scripts" / "driver.sbatch"


def _state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True)
    return out.stdout.strip().split("\n")[0].split(" ")[0]


def test_sbatch_accepts_the_driver_script(slurm_cluster):
    got = subprocess.run(["sbatch", "--test-only", str(SCRIPT), "t", "+stage=gpu1"], capture_output=True, text=True)
    assert got.returncode == 0 and "to start at" in got.stderr, got.stderr


def test_the_driver_job_runs_a_sweep_to_its_end(slurm_cluster, tmp_path):
    env = {**os.environ, "ORCH_REPO": str(ROOT), "ORCH_PYTHON": sys.executable, "ORCH_NO_RESUBMIT": "1"}
    env["ORCH_MARGIN_S"] = "60"
    args = [
        "driven",
        "+stage=gpu1",
        "cluster=slurm",
        f"ledger.url={ledger_url(tmp_path)}",
        f"cluster.folder={tmp_path / 'runs'}",
        "++cluster.poll_interval_s=0.5",
        *FAST_TWIN,
    ]
    sub = subprocess.run(
        ["sbatch", "--parsable", "--time=10", f"--output={tmp_path}/driver-%j.out", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    try:
        end = wait_for(
            lambda: _state(job) if _state(job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else "",
            480,
            f"driver job {job} to end",
        )
        log = (tmp_path / f"driver-{job}.out").read_text()
        assert end == "COMPLETED", log[-3000:]
        assert f"driver {job} on " in log and "stops driving after" in log and '"reason":' in log
        with Ledger.open(ledger_url(tmp_path)) as led:
            assert led.get_sweep("driven") is not None and led.evidence.measured(sweep="driven"), log[-3000:]
    finally:
        subprocess.run(["scancel", job], capture_output=True)
