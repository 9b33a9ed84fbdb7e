"""Jobs a partition can never run (issue 21): refused before sbatch, or stopped on a pending reason that never
clears, with the partition's size and the fix, and nothing left in the queue."""

from __future__ import annotations

import os
import subprocess

import pytest

from orchestrator.core.schema import ClusterConfig, SlurmConfig
from orchestrator.launch import LaunchTask, Unrunnable
from orchestrator.launch.slurm import SlurmLauncher, partition
from tests.sweeplib import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCONTROL = (
    "PartitionName=debug AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=04:00:00 MinNodes=0 "
    "Nodes=n[1-4] State=UP TotalCPUs=32 TotalNodes=4 TRES=cpu=32,node=4,gres/gpu=32"
)


def test_parse_reads_size_shape_and_limits():
    part = partition.parse(SCONTROL, "8|gpu:8|idle|3\n8|gpu:8|drain|1\n")
    assert part == partition.Partition("debug", 4, 3, 8, 8, 240, None, "UP")
    assert part.size() == "partition debug: 4 nodes (3 usable) x 8 CPUs x 8 GPUs, MaxTime 240 min"


def test_misfits_name_each_limit_and_its_fix():
    part = partition.parse(SCONTROL, "8|gpu:8|idle|4\n")
    assert part is not None
    fits = partition.Request("stage smoke's jobs", nodes=4, cpus_per_node=8, gpus_per_node=8, time_min=60)
    assert partition.misfits(fits, part) == []
    big = partition.Request("stage 1k's jobs", nodes=128, cpus_per_node=64, gpus_per_node=8, time_min=600)
    line = partition.refusal([fits, big], part)
    assert line is not None and line.startswith("stage 1k's jobs ask for 128 nodes, 64 CPUs per node, 600 min")
    assert "partition debug: 4 nodes x 8 CPUs x 8 GPUs" in line
    assert "a stage of at most 32 GPUs" in line and "cluster.cpus_per_task=1" in line and "MaxTime" in line
    assert "stage.gpus=32" not in line  # a guess at which the stage may have no legal layout (issue 49)


def test_only_reasons_that_never_clear_are_fatal():
    up = partition.parse(SCONTROL, "8|gpu:8|idle|4\n")
    drained = partition.parse(SCONTROL, "8|gpu:8|drain|4\n")
    assert partition.fatal_reason("PartitionConfig", up) is not None
    assert partition.fatal_reason("PartitionTimeLimit", up) is not None
    assert partition.fatal_reason("Resources", up) is None and partition.fatal_reason("Priority", up) is None
    assert partition.fatal_reason("ReqNodeNotAvail, UnavailableNodes:n1", up) is None  # a reservation: it clears
    assert partition.fatal_reason("ReqNodeNotAvail, UnavailableNodes:n[1-4]", drained) is not None


def _never(_: str) -> None:  # a task that never starts
    raise AssertionError("must not run")


def _task(folder, n_gpus: int) -> LaunchTask:
    os.makedirs(folder, exist_ok=True)
    return LaunchTask(
        fn=_never, args=("",), n_gpus=n_gpus, gpus_per_node=8, name="never", folder=str(folder), time_min=2
    )


def _cluster() -> ClusterConfig:
    return ClusterConfig(kind="slurm", min_time_min=1, slurm=SlurmConfig())


def _queued(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id.split("_")[0]], capture_output=True, text=True)
    return out.stdout.strip()


@pytest.mark.slurm(shared=True)  # refused before sbatch
def test_a_job_bigger_than_the_partition_is_refused_before_sbatch(slurm_cluster, tmp_path):
    launcher = SlurmLauncher(_cluster())
    with pytest.raises(Unrunnable) as err:
        launcher.submit([_task(tmp_path / "a", n_gpus=5 * 8)])
    assert launcher.sbatch_calls == 0
    assert "ask for 5 nodes" in str(err.value) and "partition debug: 4 nodes x 8 CPUs x 8 GPUs" in str(err.value)


@pytest.mark.slurm(shared=True)  # a job no partition can hold: it never starts
def test_a_job_pending_for_partition_config_is_cancelled_with_the_fix(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", REPO)
    launcher = SlurmLauncher(_cluster())
    monkeypatch.setattr(launcher, "check_fits", lambda tasks: None)  # as a site whose limits sinfo hides
    [sub] = launcher.submit([_task(tmp_path / "b", n_gpus=5 * 8)])
    try:

        def stopped():
            try:
                launcher.poll([sub.job_id])
            except Unrunnable as exc:
                return exc
            return None

        exc = wait_for(stopped, 120, "Slurm to give the 5-node job its pending reason")
        assert "PartitionConfig" in str(exc) and "partition debug: 4 nodes" in str(exc)
        assert "cancelled the 1 pending job(s)" in str(exc) and launcher.scancel_calls == 1
        wait_for(lambda: not _queued(sub.job_id), 60, "the cancelled job to leave the queue")
    finally:
        launcher.cancel([sub.job_id])
