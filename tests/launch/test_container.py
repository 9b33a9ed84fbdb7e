"""Containers and resources as cluster settings: refused where they cannot work, resolved from the workload."""

from __future__ import annotations

import math

import pytest

from orchestrator import cli
from orchestrator.config import ConfigError, compose
from orchestrator.core.schema import ClusterConfig, ContainerConfig, SlurmConfig, StageConfig
from orchestrator.launch.slurm import container
from orchestrator.runspec import DEFAULT_DISTRIBUTED_TIMEOUT_MIN, distributed_timeout_min, time_limit_min


def test_sbatch_extra_container_image_is_refused_naming_the_setting(capsys):
    rc = cli.main(["plan", "+stage=smoke", "cluster=slurm", "+cluster.slurm.sbatch_extra.container-image=img"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: cluster.slurm.sbatch_extra has container-image")
    assert "cluster.slurm.container.image" in err[0] and "cluster.slurm.python" in err[0]


@pytest.mark.long
def test_image_without_the_python_inside_it_is_refused():
    with pytest.raises(ConfigError, match="cluster.slurm.python"):
        compose(["cluster=slurm", "cluster.slurm.container.image=img"])
    with pytest.raises(ConfigError, match="without cluster.slurm.container.image"):
        compose(["cluster=slurm", "cluster.slurm.container.mounts=[/a:/a]"])
    cfg = compose(["cluster=slurm", "cluster.slurm.container.image=img", "cluster.slurm.python=python3"]).cfg
    assert container.python(cfg.cluster) == "python3"


def test_mounts_add_the_project_and_the_runs_folder(tmp_path):
    slurm = SlurmConfig(container=ContainerConfig(image="img", mounts=["/d:/d:ro"]), python="p")
    c = ClusterConfig(folder=str(tmp_path), slurm=slurm)
    flags = container.srun_flags(c)
    assert flags[0] == "--container-image=img"
    assert (
        flags[1]
        == f"--container-mounts=/d:/d:ro,{container.PROJECT_ROOT}:{container.PROJECT_ROOT},{tmp_path}:{tmp_path}"
    )
    assert container.srun_flags(ClusterConfig()) == [] and container.setup_lines(ClusterConfig()) == []


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["workload=megatron"], (True, 8, "0")),  # conf/workload/megatron.yaml
        (["workload=megatron", "cluster.exclusive=false", "cluster.cpus_per_task=12"], (False, 12, "0")),
        (["workload=megatron", "cluster.mem=1800G"], (True, 8, "1800G")),
        ([], (None, None, None)),  # the twin asks for nothing beyond its GPUs
    ],
)
def test_job_resources_come_from_the_workload_unless_the_cluster_says(overrides, expected):
    job = compose(["cluster=slurm", *overrides]).cfg.job_cluster()
    assert (job.exclusive, job.cpus_per_task, job.mem) == expected


def test_time_limit_leaves_room_for_the_distributed_timeout():
    """A hung collective must end in torch's watchdog error, not in Slurm's TIMEOUT."""
    from types import SimpleNamespace

    cluster = ClusterConfig(time_margin_min=10, min_time_min=5)
    stage = StageConfig(warmup_iters=2, measure_iters=3)

    def spec(argv, simulated=False):
        return SimpleNamespace(
            stage=stage,
            window=(stage.warmup_iters, stage.measure_iters),  # JobSpec.window: the attempt's own
            predicted={"step_time_s": 1.0},
            command=["python", "x.py", *argv],
            workload=SimpleNamespace(simulated=simulated),
        )

    assert distributed_timeout_min([]) == DEFAULT_DISTRIBUTED_TIMEOUT_MIN == 10
    assert distributed_timeout_min(["--distributed-timeout-minutes", "30", "--distributed-timeout-minutes", "45"]) == 45
    assert time_limit_min(spec([]), cluster) == 10 + 10
    assert time_limit_min(spec(["--distributed-timeout-minutes", "60"]), cluster) == 60 + 10
    windows = math.ceil(5 * 1.0 * 2.0 / 60 + 10)  # (warmup + measure) x step x TIME_SAFETY + margin
    assert time_limit_min(spec(["--distributed-timeout-minutes", "60"], simulated=True), cluster) == windows  # twin


@pytest.mark.long
def test_backend_settings_live_under_their_backend_and_old_snapshots_still_load():
    """cluster.slurm.* and cluster.local.* (as submitit prefixes its executors' parameters); an override of a
    key from before names where it went; a sweep stored with the flat keys still loads (resume, report)."""
    import yaml

    from orchestrator.config import root_from_yaml

    cfg = compose(["cluster=slurm", "cluster.slurm.partition=gpu", "cluster.local.max_workers=3"]).cfg
    assert (cfg.cluster.slurm.partition, cfg.cluster.local.max_workers) == ("gpu", 3)
    assert cfg.job_cluster().slurm.partition == "gpu"
    with pytest.raises(ConfigError, match=r"cluster.partition'; it moved: cluster.slurm.partition$"):
        compose(["cluster=slurm", "cluster.partition=gpu"])
    snapshot = yaml.safe_load(compose(["+stage=smoke"]).to_yaml())
    slurm, local = snapshot["cluster"].pop("slurm"), snapshot["cluster"].pop("local")
    old = {**{k: v for k, v in slurm.items() if k != "wait_s"}, "slurm_wait_s": 42.0, "partition": "old"}
    snapshot["cluster"].update(old, local_max_workers=local["max_workers"] + 5)
    back = root_from_yaml(yaml.safe_dump(snapshot)).cluster
    assert (back.slurm.partition, back.slurm.wait_s, back.local.max_workers) == ("old", 42.0, 7)
