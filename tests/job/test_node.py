"""What a rank ran with (orchestrator.job.node): the checkout's commit from its git metadata, the container
image the launcher started it in, the perf environment; a real job's sidecar carries them."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.megatron import TESTED_COMMIT
from orchestrator.core.paths import JobPaths
from orchestrator.job import megatron_run, node
from tests.job.test_preflight import git_checkout

DIGEST = "sha256:" + "ab" * 32


def test_facts_name_the_commit_the_container_and_only_the_perf_env(tmp_path, monkeypatch):
    root = git_checkout(tmp_path / "megatron-lm", TESTED_COMMIT)
    monkeypatch.setenv("NCCL_IB_TIMEOUT", "19")
    monkeypatch.setenv("NVTE_CPU_OFFLOAD_V1", "1")
    monkeypatch.setenv("HOME_SECRET_TOKEN", "never")
    monkeypatch.setenv(node.CONTAINER_ENV, f"nvcr.io/nvidia/pytorch@{DIGEST}")
    got = node.facts(root)
    assert got["versions"]["megatron_commit"] == TESTED_COMMIT
    assert got["versions"]["container_digest"] == DIGEST
    assert got["env"]["NCCL_IB_TIMEOUT"] == "19" and got["env"]["NVTE_CPU_OFFLOAD_V1"] == "1"
    assert "HOME_SECRET_TOKEN" not in got["env"] and got["node"]
    monkeypatch.setenv(node.CONTAINER_ENV, "nvcr.io#nvidia/pytorch:25.09-py3")  # a tag: no digest to record
    assert "container_digest" not in node.versions(root)
    assert "megatron_commit" not in node.versions(tmp_path)  # no git metadata: nothing made up


@pytest.mark.long
def test_a_real_jobs_sidecar_records_the_node_facts(tmp_path, monkeypatch):
    root = git_checkout(tmp_path / "megatron-lm", TESTED_COMMIT)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    path = megatron_run.write_sidecar(tmp_path / "job", 3, None, checkout=root)
    doc = json.loads(path.read_text())
    assert path == JobPaths(tmp_path / "job").sidecar(3) and doc["simulated"] is False
    assert doc["versions"]["megatron_commit"] == TESTED_COMMIT and doc["env"]["NCCL_DEBUG"] == "WARN"
    assert doc["node"]


@pytest.mark.long
def test_the_job_environment_names_the_container_image(smoke):
    from orchestrator.config import compose
    from orchestrator.runspec import build_spec

    _, (planned, *_) = smoke
    image = f"nvcr.io/nvidia/pytorch@{DIGEST}"
    cfg = compose(
        [
            "+stage=smoke",
            "cluster=slurm",
            f"cluster.slurm.container.image={image}",
            "cluster.slurm.python=/usr/bin/python",
        ]
    ).cfg
    assert build_spec(cfg, planned, sweep="s", attempt=1, job_dir="/tmp/j").env[node.CONTAINER_ENV] == image
    plain = compose(["+stage=smoke"]).cfg
    assert node.CONTAINER_ENV not in build_spec(plain, planned, sweep="s", attempt=1, job_dir="/tmp/j").env
