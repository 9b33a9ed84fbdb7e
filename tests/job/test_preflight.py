"""preflight: one table, each row pass/fail with its fix; the dev-branch V4 modules found on disk; Slurm's
limits asked from the real local cluster; a failing preflight stops the sweep; rejected candidates never run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator import preflight as pf
from orchestrator.core.schema import ClusterConfig, SlurmConfig, StageConfig
from orchestrator.job import preflight as job
from orchestrator.job.preflight import CheckStatus, PreflightRequest


def fake_dev_tree(root: Path) -> Path:
    """Only the dev-branch V4 module files, each with the line that defines what preflight looks for."""
    for mod in job.V4_MODULES:
        path = root / mod.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{mod.defines}(*args):\n    pass\n")
    entry = root / "pretrain_hybrid.py"
    entry.write_text("")
    return entry


def by_name(rows) -> dict:
    return {r["name"] if isinstance(r, dict) else r.name: r for r in rows}


def test_installed_wheel_fails_naming_the_missing_v4_modules(capsys):
    """Against megatron-core 0.19.2 (this machine): non-zero, and every missing dev module is named."""
    rc = cli.main(["preflight", "+stage=1k", "workload=megatron", "cluster=local", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    rows = by_name(out["checks"])
    assert rc == 1 and not out["ok"]
    for mod in job.V4_MODULES:
        row = rows[f"V4: {mod.what}"]
        assert row["status"] == "fail" and mod.path in row["fix"]
    assert rows["Megatron checkout"]["status"] == "fail" and "workload.command" in rows["Megatron checkout"]["fix"]
    assert rows["Slurm limits"]["status"] == "warn"  # cluster=local: a warning, not a crash
    assert (Path(out["folder"]) / "preflight.json").is_file()


def test_fake_dev_tree_passes_the_v4_rows(tmp_path):
    entry = fake_dev_tree(tmp_path / "megatron-lm")
    roots, checkout = job.megatron_roots(str(entry))
    rows = job.v4_module_checks(roots, checkout)
    assert checkout and roots == [entry.parent]
    assert all(r.status is CheckStatus.PASS for r in rows), [r for r in rows if r.status is not CheckStatus.PASS]
    (tmp_path / "megatron-lm" / job.V4_MODULES[2].path).write_text("def _top_k_routing(): pass\n")  # 0.19-like
    rows = job.v4_module_checks(roots, checkout)
    assert [r.name for r in rows if r.status is CheckStatus.FAIL] == ["V4: hash routing"]


def test_fake_dev_tree_through_the_command(tmp_path, capsys):
    """The same rows through the launcher (a local job) with workload.command pointing at the fake tree."""
    entry = fake_dev_tree(tmp_path / "megatron-lm")
    rc = cli.main(
        [
            "preflight",
            "+stage=smoke",
            "workload=megatron",
            "cluster=local",
            f"cluster.folder={tmp_path / 'runs'}",
            f"workload.command=[python,{entry}]",
            "--format",
            "json",
        ]
    )
    rows = by_name(json.loads(capsys.readouterr().out)["checks"])
    assert rc == 1  # no GPU here
    assert rows["Megatron checkout"]["status"] == "pass"
    assert all(rows[f"V4: {m.what}"]["status"] == "pass" for m in job.V4_MODULES)


def test_request_lists_every_kept_candidate_and_what_the_space_needs():
    from orchestrator.config import compose

    cfg = compose(["+stage=1k", "workload=megatron"]).cfg
    req, limits = pf.candidates(cfg)
    assert req.candidates and set(limits) == {c.key for c in req.candidates}
    assert {"deepep", "hybridep"} <= set(req.flex_backends)  # conf/stage/1k.yaml searches flex:*
    assert req.cudnn_dsa and not req.muon  # attention_backend cudnn; model.optimizer adam (dev's recipe)
    assert req.entry_script == "/opt/megatron-lm/pretrain_hybrid.py"
    assert all(c.world == 1024 for c in req.candidates)
    muon, _ = pf.candidates(compose(["+stage=1k", "workload=megatron", "model.optimizer=muon"]).cfg)
    assert muon.muon  # --optimizer muon asks preflight for the emerging-optimizers package


def test_validate_candidate_reports_megatrons_own_message(monkeypatch):
    """The verdict is Megatron's: argparse's error for an unknown flag, validate_args' assertion for a bad layout."""
    from tests.megatron_env import as_hopper, import_megatron

    import_megatron()
    ok = [
        "--num-layers",
        "4",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "128",
        "--max-position-embeddings",
        "128",
        "--micro-batch-size",
        "1",
        "--global-batch-size",
        "8",
        "--lr",
        "1e-4",
        "--train-iters",
        "10",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "128",
        "--mock-data",
    ]
    with as_hopper():
        assert job.validate_candidate_argv(ok, 8) is None
        assert "unrecognized arguments: --no-such-flag" in job.validate_candidate_argv([*ok, "--no-such-flag"], 8)
        bad = job.validate_candidate_argv([*ok, "--tensor-model-parallel-size", "3"], 8)
    assert bad and ("divisible" in bad or "AssertionError" in bad)


def test_slurm_minutes():
    assert pf.slurm_minutes("infinite") is None
    assert [pf.slurm_minutes(t) for t in ("30", "4:00:00", "1-00:00:00", "2-12", "10:30")] == [30, 240, 1440, 3600, 11]


@pytest.mark.slurm
def test_slurm_rows_from_the_local_cluster(slurm_cluster):
    stage = StageConfig(name="smoke", gpus=32, gpus_per_node=8)
    rows, rejected = pf.slurm_checks(ClusterConfig(kind="slurm"), stage, {"a": 30, "b": 60})
    got = {r.name: r for r in rows}
    assert got["partition debug MaxTime"].status is CheckStatus.PASS and not rejected  # MaxTime infinite
    assert got["GPUs per node (Slurm)"].status is CheckStatus.PASS
    assert got["nodes"].status is CheckStatus.PASS and "has 4" in got["nodes"].detail
    assert got["account"].status is CheckStatus.PASS
    big, _ = pf.slurm_checks(ClusterConfig(kind="slurm", cpus_per_task=8), StageConfig(gpus=1024, gpus_per_node=16), {})
    got = {r.name: r for r in big}
    assert got["nodes"].status is CheckStatus.FAIL and got["GPUs per node (Slurm)"].status is CheckStatus.FAIL
    assert got["CPUs per node"].status is CheckStatus.FAIL and "cluster.cpus_per_task=" in got["CPUs per node"].fix
    unknown, _ = pf.slurm_checks(ClusterConfig(kind="slurm", slurm=SlurmConfig(qos="no-such-qos")), stage, {})
    assert {r.name: r for r in unknown}["QoS no-such-qos"].status is CheckStatus.FAIL


@pytest.mark.slurm
def test_preflight_job_on_the_local_slurm_cluster(slurm_cluster, tmp_path, capsys):
    """The whole command on cluster=slurm: the job runs on a node, the Slurm rows come from sinfo/sacctmgr."""
    rc = cli.main(
        [
            "preflight",
            "+stage=smoke",
            "workload=megatron",
            "cluster=slurm",
            f"cluster.folder={tmp_path}",
            "cluster.cpus_per_task=1",
            "--format",
            "json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    rows = by_name(out["checks"])
    assert rc == 1 and out["job_id"]  # no real GPU on the test nodes
    assert rows["Python"]["status"] == "pass" and rows["torch + CUDA"]["status"] == "fail"
    assert rows["partition debug MaxTime"]["status"] == "pass" and rows["nodes"]["status"] == "pass"


def test_request_round_trips_through_the_report(tmp_path):
    report = job.PreflightReport([job.Check("x", CheckStatus.WARN, "d", "f")], {"k": "why"})
    report.save(tmp_path)
    back = job.PreflightReport.load(tmp_path)
    assert back.checks[0].status is CheckStatus.WARN and back.rejected == {"k": "why"}
    assert PreflightRequest(entry_script="e", gpus_per_node=8).candidates == []
