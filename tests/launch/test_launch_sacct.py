"""sacct parsing and sbatch parameters: pure functions, no cluster needed."""

from __future__ import annotations

from datetime import UTC

import pytest
from submitit.slurm.slurm import _make_sbatch_string

from orchestrator.core.schema import ClusterConfig, ContainerConfig, SlurmConfig
from orchestrator.core.states import AttemptState
from orchestrator.launch import LaunchTask
from orchestrator.launch.base import LaunchError, shape, state_of
from orchestrator.launch.slurm import sacct
from orchestrator.launch.slurm.launcher import SlurmLauncher
from orchestrator.launch.slurm.sacct import command, expand_job_id, parse

SACCT = """\
43801313_0|COMPLETED|0:0|n1|2026-11-29T11:08:43|2026-11-29T11:08:46|None
43801313_1|CANCELLED by 0|0:15|n2|2026-11-29T11:08:43|2026-11-29T11:08:50|None
43801313_[2-4,7%2]|PENDING|0:0|None assigned|Unknown|Unknown|JobArrayTaskLimit
43801320|TIMEOUT|0:0|n[1-2]|2026-11-29T11:00:00|2026-11-29T11:01:30|TimeLimit
43801320.batch|CANCELLED|0:15|n1|2026-11-29T11:00:00|2026-11-29T11:01:30|None
43801321|FAILED|3:0|n3|2026-11-29T11:00:00|2026-11-29T11:00:05|NonZeroExitCode
43801322|REQUEUED|0:0|n4|2026-11-29T11:00:00|2026-11-29T11:00:05|None
43801323|PREEMPTED|0:0|n4|2026-11-29T11:00:00|2026-11-29T11:00:05|None
43801794|NODE_FAIL|0:0|n4|2026-11-29T11:25:25|2026-11-29T11:25:28|None
43801794|PENDING|0:0|None assigned|Unknown|Unknown|BeginTime
"""


def test_expand_array_ids():
    assert expand_job_id("12") == ["12"]
    assert expand_job_id("12_3") == ["12_3"]
    assert expand_job_id("12_[1-3,7%2]") == ["12_1", "12_2", "12_3", "12_7"]


def test_parse_rows():
    st = parse(SACCT)
    assert set(st) == {
        "43801313_0",
        "43801313_1",
        "43801313_2",
        "43801313_3",
        "43801313_4",
        "43801313_7",
        "43801320",
        "43801321",
        "43801322",
        "43801323",
        "43801794",
    }
    done = st["43801313_0"]
    assert (done.state, done.terminal, done.exit_code, done.node_list) == ("COMPLETED", True, 0, "n1")
    assert done.start.tzinfo is not None and (done.end - done.start).total_seconds() == 3
    assert done.end.astimezone(UTC) == done.end
    cancelled = st["43801313_1"]
    assert (cancelled.state, cancelled.terminal, cancelled.signal) == ("CANCELLED", True, 15)
    pending = st["43801313_4"]
    assert (pending.state, pending.terminal, pending.node_list, pending.start) == ("PENDING", False, None, None)
    assert pending.reason == "JobArrayTaskLimit"
    # The batch step row does not override the allocation's TIMEOUT.
    assert (st["43801320"].state, st["43801320"].node_list, st["43801320"].reason) == ("TIMEOUT", "n[1-2]", "TimeLimit")
    assert (st["43801321"].state, st["43801321"].exit_code) == ("FAILED", 3)
    assert not st["43801322"].terminal and st["43801323"].terminal  # --no-requeue: a preempted job ends there
    # Slurm requeued a NODE_FAIL itself (same id): the latest run counts, the failure is kept.
    requeued = st["43801794"]
    assert (requeued.state, requeued.terminal, requeued.previous, requeued.reason) == (
        "PENDING",
        False,
        ("NODE_FAIL",),
        "BeginTime",
    )
    assert done.previous == ()


@pytest.mark.parametrize(
    "word",
    [
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    ],
)
def test_terminal_states(word):
    assert state_of(word).terminal and word in AttemptState.TERMINAL
    assert state_of(f"{word}+").state == word  # sacct marks a truncated or multi-state field with "+"


@pytest.mark.parametrize(
    "word",
    ["PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "UNKNOWN"],
)
def test_live_states(word):
    assert not state_of(word).terminal and word in AttemptState.LIVE


def test_a_state_word_slurm_adds_later_stays_live_and_is_kept():
    st = state_of("NEW_STATE_WORD")
    assert st.state is AttemptState.UNKNOWN and not st.terminal and "NEW_STATE_WORD" in st.reason


def test_command_queries_base_ids_once():
    cmd = command(["101_3", "101_4", "99", "1000_0"])
    assert cmd[cmd.index("-j") + 1] == "99,101,1000"
    assert "--parsable2" in cmd and "--allocations" in cmd and "--duplicates" in cmd


def lt(n_gpus, per_node, name="sw:abc:1", time_min=7):
    return LaunchTask(
        fn=print, args=(), n_gpus=n_gpus, gpus_per_node=per_node, name=name, folder="/tmp/x", time_min=time_min
    )


def test_shape_one_task_per_gpu():
    assert shape(lt(32, 8)) == (4, 8, 8)
    assert shape(lt(4, 8)) == (1, 4, 4)
    with pytest.raises(LaunchError, match="multiple"):
        shape(lt(12, 8))


def test_sbatch_parameters_from_cluster():
    cluster = ClusterConfig(
        kind="slurm",
        exclusive=True,
        min_time_min=5,
        signal_delay_s=30,
        env={"NCCL_IB_TIMEOUT": "19"},
        slurm=SlurmConfig(
            partition="batch",
            account="acct",
            qos="high",
            constraint="h100",
            array_parallelism=16,
            sbatch_extra={"reservation": "resv"},
            container=ContainerConfig(image="nvcr.io/nvidia/pytorch:25.01-py3", mounts=["/data:/data"]),
            python="/usr/bin/python",
            srun_args=["--mpi=pmix"],
            setup=["module load cuda"],
        ),
    )
    params = SlurmLauncher(cluster).parameters([lt(1024, 8, "sw:a:1", 3), lt(1024, 8, "sw:b:1", 40)])
    assert (params["nodes"], params["ntasks_per_node"], params["gpus_per_node"]) == (128, 8, 8)
    assert params["time"] == 40  # longest in the array
    assert SlurmLauncher(cluster).parameters([lt(8, 8, time_min=2)])["time"] == 5  # cluster minimum
    script = _make_sbatch_string(command="python -m x", folder="/tmp/f/%j", map_count=2, **params)
    for line in [
        "#SBATCH --partition=batch",
        "#SBATCH --account=acct",
        "#SBATCH --qos=high",
        "#SBATCH --constraint=h100",
        "#SBATCH --exclusive",
        "#SBATCH --signal=USR2@30",
        "#SBATCH --reservation=resv",
        "#SBATCH --array=0-1%2",
        "#SBATCH --nodes=128",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "module load cuda",
        "export NCCL_IB_TIMEOUT=19",
    ]:
        assert line in script
    srun = script.split("\nsrun ", 1)[1]
    assert "--mpi=pmix" in srun and "--container-image=nvcr.io/nvidia/pytorch:25.01-py3" in srun
    assert "--container-mounts=/data:/data," in srun  # the project and cluster.folder are appended
    assert "#SBATCH --container" not in script  # pyxis would run the batch script itself in the container
    assert "#SBATCH --exclude" not in script


def test_node_fail_retry_excludes_the_failed_nodes():
    """A task carrying `exclude` (the sweep sets it for a NODE_FAIL retry) gets `#SBATCH --exclude`."""
    import dataclasses

    task = dataclasses.replace(lt(16, 8), exclude="n[2-3]")
    params = SlurmLauncher(ClusterConfig(kind="slurm")).parameters([task])
    script = _make_sbatch_string(command="python -m x", folder="/tmp/f/%j", map_count=1, **params)
    assert "#SBATCH --exclude='n[2-3]'" in script  # submitit shell-quotes the value


def test_a_pending_array_cancelled_whole_is_listed_under_its_base_id():
    """Slurm 22.05 lists an array scancel'ed before any task started as ONE row under the bare base id: its
    tasks take that row's state instead of staying UNKNOWN (live) forever (issue 10's flaky cancel test)."""
    found = sacct.parse("44193802|CANCELLED by 0|0:0|None assigned|Unknown|2026-11-30T15:10:00|None\n")
    for task in ("44193802_0", "44193802_1"):
        st = sacct.state_for(found, task)
        assert st is not None and st.state == "CANCELLED" and st.terminal
    assert sacct.state_for(found, "44193803_0") is None  # another array: nothing borrowed
    listed = sacct.parse("7_0|COMPLETED|0:0|n1|Unknown|Unknown|None\n7|CANCELLED|0:0|n1|Unknown|Unknown|None\n")
    assert sacct.state_for(listed, "7_0").state == "COMPLETED"  # a task's own row wins over the base's


# Real sacct output of one 4-task array (`sbatch --array=0-3 -N1 --gpus-per-node=8`, Slurm on n1..n4), the
# fields JobID|State|ExitCode|NodeList|Start|End|Reason: first as the array starts (one row under the bare base
# id, naming the node of the task whose raw id is the base: the last), then each task under its own id.
ARRAY_STARTING = "44531889|PENDING|0:0|n4|2026-12-01T14:14:49|Unknown|None\n"
ARRAY_RUNNING = """\
44531889_0|RUNNING|0:0|n1|2026-12-01T14:14:49|Unknown|None
44531889_1|RUNNING|0:0|n2|2026-12-01T14:14:49|Unknown|None
44531889_2|RUNNING|0:0|n3|2026-12-01T14:14:49|Unknown|None
44531889_3|RUNNING|0:0|n4|2026-12-01T14:14:49|Unknown|None
"""


def test_array_tasks_get_their_own_node_never_the_base_rows():
    """Issue 22 item 5: every task took the base row's node (n4) and kept it; task _0 ran on n1."""
    tasks = [f"44531889_{i}" for i in range(4)]
    starting = sacct.parse(ARRAY_STARTING)
    for t in tasks:
        st = sacct.state_for(starting, t)
        assert st is not None and st.state == "PENDING" and st.node_list is None and st.start is None, (t, st)
    running = sacct.parse(ARRAY_RUNNING)
    assert {t: sacct.state_for(running, t).node_list for t in tasks} == dict(zip(tasks, ["n1", "n2", "n3", "n4"]))
