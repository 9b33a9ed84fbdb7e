"""On the local 4-node cluster, a 1k stage (128 nodes) can never run (issue 21): `sweep` and `preflight` say so in
one `error:` line naming the partition's size and the fix, submit nothing that would pend, write no sweep."""

from __future__ import annotations

import os

import pytest

from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import cli, ledger_url, slurm_shims

pytestmark = pytest.mark.slurm

SIZE = "partition debug: 4 nodes x 8 CPUs x 8 GPUs"


def _env(shims) -> dict[str, str]:
    return {"PATH": f"{shims.bindir}:{os.environ['PATH']}"}


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_sweep_of_a_stage_bigger_than_the_partition_stops_before_any_job(slurm_cluster, tmp_path):
    shims = slurm_shims(tmp_path)
    args = ["+stage=1k", "cluster=slurm", f"ledger.url={ledger_url(tmp_path)}", f"cluster.folder={tmp_path / 'runs'}"]
    got = cli("sweep", *args, "--plain", env=_env(shims), timeout=300)
    assert got.returncode == 2, got.stderr[-2000:]
    [error] = _errors(got.stderr)
    assert "stage 1k's job(s) ask for 128 nodes" in error and SIZE in error, error
    assert "a stage of at most 32 GPUs that has a legal layout" in error and "cluster.slurm.partition=" in error
    # the command it names runs there (issue 49 item 5: `stage.gpus=32` sent 1k to "no legal layout")
    assert "this runs there: `python -m orchestrator sweep +stage=smoke cluster=slurm " in error, error
    assert shims.calls("sbatch") in ([], ["--version"]) and not shims.submitted()  # asked, never submitted
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert led.list_sweeps() == []  # nothing half-written: no sweep to resume into the same wall


def test_preflight_prints_its_checks_first_and_never_waits_on_a_job_that_cannot_start(slurm_cluster, tmp_path):
    shims = slurm_shims(tmp_path)
    got = cli(
        "preflight",
        "+stage=1k",
        "workload=megatron",
        "cluster=slurm",
        f"cluster.folder={tmp_path / 'runs'}",
        env=_env(shims),
        timeout=300,
    )
    assert got.returncode == 2, got.stderr[-2000:]
    [error] = _errors(got.stderr)
    assert "ask for 128 nodes, 64 CPUs per node" in error and SIZE in error, error
    assert "cluster.cpus_per_task=1" in error and "a stage of at most 32 GPUs" in error, error
    out = got.stdout
    assert out.index("checked from here (before the job)") < out.index("preflight: FAIL")
    assert "not submitted: preflight job(s) ask for 64 CPUs per node" in " ".join(out.split())
    assert not shims.submitted()  # the 64-CPU job on 8-CPU nodes never went out to pend
