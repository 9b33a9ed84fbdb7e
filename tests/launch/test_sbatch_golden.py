"""The batch scripts submitit writes for our jobs, recorded (Slurm-free, like submitit's own recorded sbatch
test): a change to what a cluster receives is a visible diff of tests/golden/sbatch_*.sh. UPDATE_GOLDEN=1
rewrites them. Paths (this checkout, the runs folder, this Python) are normalised.

Why each fact: pyxis runs a whole batch script inside the container when `--container-image` is an
#SBATCH option, and srun cannot be used from there, so the container flags must sit on the srun line
(pyxis README/FAQ); submitit runs `<python> -u -m submitit.core._submit` on every task with the executor's
`python=` (submitit/slurm/slurm.py: SlurmExecutor._submitit_command_str), which must be the container's."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import submitit

from orchestrator.config import compose
from orchestrator.job.entry import run_task
from orchestrator.launch import LaunchTask
from orchestrator.launch.slurm import SlurmLauncher
from orchestrator.launch.slurm.container import PROJECT_ROOT

GOLDEN = Path(__file__).parent.parent / "golden"
IMAGE = "nvcr.io#nvidia/pytorch:25.09-py3"
CONTAINER = [
    f"cluster.slurm.container.image='{IMAGE}'",  # Hydra needs the quotes for the '#'
    "cluster.slurm.container.mounts=[/lustre/data:/data:ro]",
    "cluster.slurm.container.workdir=/workspace",
    "cluster.slurm.python=/usr/bin/python",
]
SITE = ["cluster.slurm.partition=batch", "cluster.slurm.account=llm", "cluster.slurm.qos=normal"]
CASES = {
    # name: (overrides, tasks as (N, gpus per node), time limit)
    "megatron_1k_container": (["+stage=1k", "workload=megatron", *SITE, *CONTAINER], [(1024, 8)], 120),
    "megatron_8k": (["+stage=8k", "workload=megatron", *SITE], [(8192, 8)], 240),
    "twin_smoke": (["+stage=smoke"], [(32, 8), (32, 8)], 5),
}


def script_for(name: str, runs: Path) -> str:
    overrides, shapes, time_min = CASES[name]
    cfg = compose(["cluster=slurm", f"cluster.folder={runs}", *overrides], require_stage=True).cfg
    tasks = [
        LaunchTask(
            fn=run_task,
            args=(),
            n_gpus=n,
            gpus_per_node=per_node,
            name=f"{name}:cand{i}:1",
            folder=str(runs / name / f"cand{i}" / "attempt-1"),
            time_min=time_min,
        )
        for i, (n, per_node) in enumerate(shapes)
    ]
    text = SlurmLauncher(cfg.job_cluster()).batch_script(tasks)
    for path, token in (
        (shlex.quote(sys.executable), "<python>"),
        (str(runs), "<runs>"),
        (str(PROJECT_ROOT), "<project>"),
    ):
        text = text.replace(path, token)
    return text


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_sbatch(name, tmp_path):
    text = script_for(name, tmp_path / "runs")
    path = GOLDEN / f"sbatch_{name}.sh"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed: review the diff, then UPDATE_GOLDEN=1"


@pytest.mark.long
def test_containerized_1k_runs_the_tasks_in_the_container(tmp_path):
    text = script_for("megatron_1k_container", tmp_path / "runs")
    header, _, body = text.partition("\n# command\n")
    srun = next(line for line in body.splitlines() if line.startswith("srun "))
    assert "#SBATCH --container" not in header  # the batch script itself stays outside
    assert f"--container-image='{IMAGE}'" in srun or f"--container-image={IMAGE}" in srun
    assert "--container-mounts=/lustre/data:/data:ro,<project>:<project>,<runs>:<runs>" in srun
    job = "<runs>/megatron_1k_container/cand0/attempt-1/.submitit"
    assert srun.endswith(f"/usr/bin/python -u -m submitit.core._submit {job}")
    assert "<python>" not in text  # never the login node's interpreter inside the container
    assert "export PYTHONPATH=<project>" in header  # the container's Python imports the pickled job
    for line in ("#SBATCH --exclusive", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=0", "#SBATCH --nodes=128"):
        assert line in header
    assert f"--label --output {job}/%j_%N_log.out --error {job}/%j_%N_log.err" in srun  # per node, not per task


def test_twin_asks_for_no_whole_nodes(tmp_path):
    text = script_for("twin_smoke", tmp_path / "runs")
    assert "--exclusive" not in text and "--cpus-per-task" not in text and "--mem" not in text
    assert "#SBATCH --array=0-1%2" in text and "%A_%a_%N_log.out" in text
    assert text.rstrip().endswith("<python> -u -m submitit.core._submit <runs>/twin_smoke/.submitit")


def test_batch_script_is_what_submitit_writes(tmp_path, monkeypatch):
    """batch_script() renders through submitit's own executor path: same text as SlurmExecutor would submit."""
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # no srun needed
    runs = tmp_path / "runs"
    cfg = compose(["cluster=slurm", f"cluster.folder={runs}", "+stage=1k", "workload=megatron", *CONTAINER]).cfg
    launcher = SlurmLauncher(cfg.job_cluster())
    task = LaunchTask(fn=run_task, args=(), n_gpus=16, gpus_per_node=8, name="x", folder=str(runs / "a"), time_min=9)
    folder = launcher.executor_folder([task])
    executor = submitit.SlurmExecutor(folder=folder, python="/usr/bin/python")
    executor.update_parameters(**launcher.parameters([task], folder))
    expected = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert launcher.batch_script([task]) == expected


def test_a_one_gpu_probe_task_shares_its_node_under_workload_megatron(tmp_path):
    """workload=megatron asks for whole nodes (--exclusive, --mem=0); a one-GPU rank-probe task must not: it
    asks for its GPU, its CPUs and its GPU's share of the node's memory, so Slurm packs 8 on a node."""
    cfg = compose(["cluster=slurm", f"cluster.folder={tmp_path}", "+stage=1k", "workload=megatron"]).cfg
    launcher = SlurmLauncher(cfg.job_cluster())
    launcher._node_mem_mb = lambda: 2_048_000  # type: ignore[method-assign]  # sinfo %m of a 2 TB node
    probe = LaunchTask(fn=run_task, args=(), n_gpus=1, gpus_per_node=8, name="p:1", folder=str(tmp_path), time_min=9)
    full = LaunchTask(fn=run_task, args=(), n_gpus=1024, gpus_per_node=8, name="f:1", folder=str(tmp_path), time_min=9)
    p, f = launcher.parameters([probe, probe]), launcher.parameters([full])
    assert "exclusive" not in p and (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"]) == (1, 1, 1)
    assert p["cpus_per_task"] == 8 and p["mem"] == "256000M"  # one eighth of the node
    assert f["exclusive"] is True and f["mem"] == "0"  # a full-scale job still takes whole nodes
    launcher._node_mem_mb = lambda: None  # type: ignore[method-assign]  # Slurm does not say: no --mem at all
    assert "mem" not in launcher.parameters([probe])
    sized = SlurmLauncher(replace(cfg.job_cluster(), mem="1800G"))
    assert sized.parameters([probe])["mem"] == "230400M"  # 1800G / 8
