"""orchestrator.job.entry: the workload contract on the compute node (rank env, files kept, failures surface)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import submitit

from orchestrator.core.schema import HardwareConfig, ModelConfig, StageConfig, WorkloadConfig
from orchestrator.core.spec import JobSpec
from orchestrator.job.entry import TaskFailed, command_problem, master_port, rank_env, run_task

ECHO = textwrap.dedent(
    """
    import json, os, sys
    keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ORCH_SINGLE_PROCESS",
            "ORCH_JOB_DIR", "ORCH_JOB_SPEC", "FROM_CLUSTER", "FROM_WORKLOAD"]
    print(json.dumps({"env": {k: os.environ.get(k) for k in keys}, "argv": sys.argv[1:], "cwd": os.getcwd()}))
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("EXIT_WITH", "0")))
    """
)


def make_spec(tmp_path: Path, *, exit_with: int = 0, n_gpus: int = 16) -> JobSpec:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "echo_env.py"
    script.write_text(ECHO)
    workload = WorkloadConfig(
        name="echo",
        command=["python", str(script)],
        simulated=False,
        extra_args=["--extra", "1"],
        env={"FROM_WORKLOAD": "w", "EXIT_WITH": str(exit_with)},
    )
    return JobSpec(
        sweep="t",
        candidate_key="abc",
        attempt=1,
        layout={"tp": 1},
        model=ModelConfig(),
        stage=StageConfig(),
        hardware=HardwareConfig(),
        workload=workload,
        env={"FROM_CLUSTER": "c", "FROM_WORKLOAD": "cluster-loses"},
        argv=["--tensor-model-parallel-size", "1", "--micro-batch-size", "2"],
        job_dir=str(tmp_path / "job"),
        master_port=29611,
        n_gpus=n_gpus,
        gpus_per_node=8,
    )


def test_local_mode_rank_env_and_files(tmp_path):
    spec = make_spec(tmp_path, n_gpus=16)
    outcome = run_task(spec)
    job = Path(spec.job_dir)
    assert outcome["rank"] == 15 and outcome["returncode"] == 0 and outcome["single_process"]
    seen = json.loads((job / "rank-15.out").read_text())
    env = seen["env"]
    # One process stands for the job: WORLD_SIZE = N, RANK = N - 1 (prints the iteration lines).
    assert env["WORLD_SIZE"] == "16" and env["RANK"] == "15" and env["LOCAL_RANK"] == "0"
    assert env["ORCH_SINGLE_PROCESS"] == "1" and env["MASTER_PORT"] == "29611"
    assert env["ORCH_JOB_DIR"] == str(job) and Path(env["ORCH_JOB_SPEC"]) == job / "job.json"
    assert JobSpec.load(env["ORCH_JOB_SPEC"]) == spec
    # cluster.env and workload.env both reach the workload; workload.env wins on a clash.
    assert env["FROM_CLUSTER"] == "c" and env["FROM_WORKLOAD"] == "w"
    # command + candidate flags + extra_args, in that order; cwd is the job folder.
    assert seen["argv"] == spec.argv + ["--extra", "1"]
    assert Path(seen["cwd"]) == job
    assert (job / "rank-15.err").read_text().strip() == "to stderr"


def test_nonzero_exit_raises_after_files_written(tmp_path):
    spec = make_spec(tmp_path, exit_with=3, n_gpus=8)
    with pytest.raises(TaskFailed, match="rank 7 exited with code 3"):
        run_task(spec)
    job = Path(spec.job_dir)
    assert json.loads((job / "rank-7.out").read_text())["env"]["RANK"] == "7"
    assert "to stderr" in (job / "rank-7.err").read_text()


def test_missing_command_is_a_failed_task(tmp_path):
    spec = make_spec(tmp_path, n_gpus=2)
    spec.workload.command = [str(tmp_path / "does-not-exist")]
    with pytest.raises(TaskFailed, match="code 127"):
        run_task(spec)
    assert "failed to start workload" in (Path(spec.job_dir) / "rank-1.err").read_text()


def test_slurm_rank_env_from_submitit_job_environment(tmp_path, monkeypatch):
    """Under Slurm: one task per GPU, ranks from submitit's JobEnvironment, MASTER_ADDR = first host."""
    for k, v in {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "42",
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[3-4]",
    }.items():
        monkeypatch.setenv(k, v)
    renv = rank_env(make_spec(tmp_path), submitit.JobEnvironment())
    assert (renv.rank, renv.world_size, renv.local_rank, renv.master_addr) == (9, 16, 1, "n3")
    assert not renv.single_process and "ORCH_SINGLE_PROCESS" not in renv.as_env()
    # MASTER_PORT follows the job id (not one fixed port for every job on a shared node).
    assert renv.master_port == 29611 + 42
    monkeypatch.setenv("SLURM_JOB_ID", "2043")
    assert rank_env(make_spec(tmp_path), submitit.JobEnvironment()).master_port == 29611 + 43  # span 2000


def test_master_port_stays_below_ephemeral_ports(tmp_path):
    spec = make_spec(tmp_path)
    spec.master_port, spec.master_port_span = 29500, 2000
    ports = {master_port(spec, str(job_id)) for job_id in range(100_000, 104_000)}
    assert len(ports) == 2000 and min(ports) == 29500 and max(ports) < 32768  # Linux ip_local_port_range
    assert master_port(spec, None) == 29500


@pytest.mark.long
@pytest.mark.timeout(120)
def test_failure_surfaces_through_submitit_local_executor(tmp_path):
    """The function submitit runs: a non-zero workload exit is a failed submitit job."""
    ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
    ex.update_parameters(timeout_min=2)
    good = ex.submit(run_task, make_spec(tmp_path / "a", n_gpus=4))
    bad = ex.submit(run_task, make_spec(tmp_path / "b", exit_with=5, n_gpus=4))
    assert good.result()["rank"] == 3
    with pytest.raises(Exception, match="exited with code 5"):
        bad.result()
    assert "to stderr" in (tmp_path / "b" / "job" / "rank-3.err").read_text()


@pytest.mark.long
def test_in_process_workload_keeps_files_and_exit_code(tmp_path):
    """workload.in_process: the entry script runs inside the task (orchestrator.job.megatron_run) with the same
    rank env; its fd-level output still lands in the rank files and its exit code fails the task."""
    spec = make_spec(tmp_path, exit_with=4, n_gpus=8)
    spec.workload.in_process = True
    with pytest.raises(TaskFailed, match="rank 7 exited with code 4"):
        run_task(spec)
    job = Path(spec.job_dir)
    seen = json.loads((job / "rank-7.out").read_text())
    assert seen["env"]["RANK"] == "7" and seen["env"]["ORCH_SINGLE_PROCESS"] == "1"
    assert seen["argv"] == spec.argv + ["--extra", "1"]
    assert "to stderr" in (job / "rank-7.err").read_text()
    sidecar = json.loads((job / "sidecar-rank-7.json").read_text())
    assert sidecar["rank"] == 7 and sidecar["simulated"] is False
    assert os.environ.get("ORCH_JOB_DIR") is None  # the task's env is restored afterwards


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (["python", "x.py"], "script x.py is a relative path"),
        (["python", "-u", "-W", "ignore", "x.py"], "script x.py is a relative path"),
        (["bash", "-e", "run.sh"], "script run.sh is a relative path"),
        (["python", "/no/such/x.py"], "script /no/such/x.py does not exist"),
        (["python", "-m", "orchestrator.job.twin"], None),  # a module, not a script
        (["python", "-um", "orchestrator.job.twin"], None),
        (["bash", "-lc", "echo hi"], None),  # a code string
        (["python", __file__], None),
    ],
)
def test_an_interpreters_script_must_be_an_absolute_path_that_exists(command, why):
    """A job runs in its own folder, so `python x.py` there finds nothing: refused before round 0, the fix named."""
    problem = command_problem(command)
    assert (problem is None) if why is None else (why in problem and ("absolute" in problem or "exist" in problem))
