"""scripts/driver.sbatch (issue 21): the sweep driver as a small Slurm job, submitted on the local cluster with a
one-GPU sweep; it drives the sweep to its end from a compute node and leaves the result in the ledger."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import FAST_TWIN, ROOT, ledger_url, wait_for

pytestmark = pytest.mark.slurm
SCRIPT = ROOT / "scripts" / "driver.sbatch"


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
LIMIT_MIN = 10  # the driver job's --time; it stops driving ORCH_MARGIN_S before it


def _state(job_id: str) -> str:
    """The job's state from slurmctld itself (squeue keeps an ended job for MinJobAge), else from accounting:
    sacct alone can lag behind a job's end when slurmdbd is slow to take the record."""
    live = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    if live.returncode == 0 and live.stdout.strip():
        return live.stdout.strip().split("\n")[0]
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True)
    return out.stdout.strip().split("\n")[0].split(" ")[0]


def _cluster_picture(job_id: str, log: Path) -> str:
    """What a failure message needs to say why the driver did not end: the job as slurmctld and accounting see
    it, every job in the queue, the nodes, and the driver's own log (its sweep's status lines)."""
    cmds = [
        ["scontrol", "show", "job", job_id],
        ["squeue", "-a", "-o", "%i %j %T %r %D %N %M"],
        ["sinfo", "-N", "-o", "%N %T %E"],
        ["sacct", "-n", "-X", "-P", "-S", "now-1hour", "-o", "JobID,JobName,State,Start,End,NodeList"],
    ]
    parts = [f"$ {' '.join(c)}\n{subprocess.run(c, capture_output=True, text=True).stdout.strip()}" for c in cmds]
    parts.append(f"driver log:\n{log.read_text()[-3000:] if log.exists() else '(none)'}")
    return "\n".join(parts)


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
        ["sbatch", "--parsable", f"--time={LIMIT_MIN}", f"--output={tmp_path}/driver-%j.out", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    out = tmp_path / f"driver-{job}.out"
    try:
        try:  # the job's own time limit is the guard: the driver stops driving before it, and says why
            end = wait_for(
                lambda: s if (s := _state(job)) in ENDED else "", LIMIT_MIN * 60 + 90, f"driver {job} to end"
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_cluster_picture(job, out)}") from None
        log = out.read_text()
        assert end == "COMPLETED", _cluster_picture(job, out)
        assert f"driver {job} on " in log and "stops driving after" in log and '"reason":' in log
        with Ledger.open(ledger_url(tmp_path)) as led:
            assert led.get_sweep("driven") is not None and led.evidence.measured(sweep="driven"), _cluster_picture(
                job, out
            )
    finally:
        subprocess.run(["scancel", job], capture_output=True)
