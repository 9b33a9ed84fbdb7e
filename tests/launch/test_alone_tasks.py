"""A rank probe's ranks as one-GPU tasks of their own (LaunchTask.alone), without Slurm: the array indexes the
driver's intents take, the arrays' chunks (a probe's tasks never split), the one attempt's id in Slurm's range
notation and its state merged from its tasks'."""

from __future__ import annotations

from orchestrator.core.schema import ClusterConfig, SlurmConfig
from orchestrator.core.states import AttemptState
from orchestrator.launch import LaunchTask
from orchestrator.launch.base import Launcher, merged, state_of
from orchestrator.launch.slurm import SlurmLauncher
from orchestrator.launch.slurm.launcher import array_size, span
from orchestrator.launch.slurm.sacct import expand_job_id


def lt(name: str, n_gpus: int = 1, alone: int = 1) -> LaunchTask:
    return LaunchTask(
        fn=print, args=(), n_gpus=n_gpus, gpus_per_node=8, name=name, folder=f"/x/{name}", time_min=5, alone=alone
    )


def test_a_rounds_probes_are_one_array_of_one_gpu_tasks_each_probe_its_consecutive_indexes():
    tasks = [lt("full", 1024), lt("p1", alone=3), lt("p2", alone=2), lt("p3", alone=3)]
    launcher = SlurmLauncher(ClusterConfig(kind="slurm", slurm=SlurmConfig(max_array_size=6)))
    groups = launcher.arrays(tasks)
    assert groups == [[0], [1, 2], [3]]  # 3 + 2 tasks fit a chunk of 6; the third probe's 3 never split
    assert [Launcher.array_indexes(tasks, g) for g in groups] == [[None], [0, 3], [0]]
    assert array_size([tasks[1], tasks[2]]) == 5
    assert launcher.parameters([tasks[1], tasks[2]])["ntasks_per_node"] == 1  # one GPU, one task each


def test_one_attempts_tasks_are_one_id_in_slurms_range_notation_and_one_merged_state():
    assert span(["123_4", "123_5", "123_6"]) == "123_[4-6]"
    assert expand_job_id("123_[4-6]") == ["123_4", "123_5", "123_6"]
    done, oom, running = state_of("COMPLETED", exit_code=0), state_of("OUT_OF_MEMORY", exit_code=1), state_of("RUNNING")
    assert merged([done, running, done]).state == AttemptState.RUNNING and not merged([done, running]).terminal
    last = merged([done, oom, done])
    assert last.terminal and last.state == AttemptState.OUT_OF_MEMORY and last.exit_code == 1
    assert merged([done, done]).state == AttemptState.COMPLETED
