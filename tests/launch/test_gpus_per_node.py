"""GPUs per node come from the hardware group (issue 21): GB200/GB300 trays hold 4, so a 1k stage is 256 nodes
of 4 in the plan and in sbatch; any cluster size is a stage (`stage.gpus=N`, `+stage=custom`), N whole nodes."""

from __future__ import annotations

import pytest

from orchestrator.config import ConfigError, compose
from orchestrator.launch.slurm import SlurmLauncher
from orchestrator.plan.planner import plan
from orchestrator.runspec import build_spec, launch_task


def _script(tmp_path, *overrides: str) -> tuple[str, int]:
    cfg = compose(["+stage=1k", "cluster=slurm", f"cluster.folder={tmp_path}", *overrides]).cfg
    best = plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name).candidates[0]
    spec = build_spec(cfg, best, sweep="s", attempt=1, job_dir=tmp_path / "a")
    task = launch_task(cfg, spec)
    return SlurmLauncher(cfg.job_cluster()).batch_script([task]), cfg.stage.gpus_per_node


@pytest.mark.parametrize(("hardware", "per_node"), [("gb200", 4), ("gb300", 4), ("h200", 8), ("b200", 8)])
def test_the_hardware_group_sets_gpus_per_node_in_the_plan_and_in_sbatch(tmp_path, hardware, per_node):
    text, gpn = _script(tmp_path, f"hardware={hardware}")
    assert gpn == per_node
    assert f"#SBATCH --nodes={1024 // per_node}\n" in text
    assert f"#SBATCH --gpus-per-node={per_node}\n" in text and f"#SBATCH --ntasks-per-node={per_node}\n" in text


def test_an_explicit_gpus_per_node_wins_over_the_hardware():
    assert compose(["+stage=1k", "hardware=gb200", "stage.gpus_per_node=8"]).cfg.stage.gpus_per_node == 8


@pytest.mark.long
def test_any_cluster_size_is_a_stage_of_whole_nodes():
    cfg = compose(["+stage=custom", "stage.gpus=512", "hardware=gb200"]).cfg
    assert (cfg.stage.name, cfg.stage.gpus, cfg.stage.gpus_per_node) == ("custom", 512, 4)
    assert compose(["+stage=1k", "stage.gpus=256"]).cfg.stage.gpus == 256
    with pytest.raises(ConfigError, match=r"stage custom has no size: add stage.gpus=N, a multiple of the 8 GPUs"):
        compose(["+stage=custom"])
    with pytest.raises(ConfigError, match=r"stage.gpus=1002 is not a multiple of the 4 GPUs per node of hardware "):
        compose(["+stage=1k", "stage.gpus=1002", "hardware=gb200"])
    # the whole-node sizes suggested are those the planner has a legal layout at, below and above (1000 and 1008
    # have none; 512 has six since the 1k stage searches activation offload, 960-1000 none)
    with pytest.raises(ConfigError, match=r"use stage.gpus=512 or stage.gpus=1024$"):
        compose(["+stage=1k", "stage.gpus=1001"])
