"""`python -m orchestrator run-one`: plan -> spec -> launch -> wait -> collect -> print, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.paths import JobPaths
from orchestrator.plan.layout import Layout
from orchestrator.plan.ranks import evidence_ranks

ROOT = Path(__file__).resolve().parents[2]
FAST = ["++workload.twin.time_scale=0.000001", "++workload.twin.max_sleep_s=0.001"]


def run_one(tmp_path, *args, timeout=300):
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "run-one",
        "+stage=smoke",
        "--folder",
        str(tmp_path / "runs"),
        *FAST,
        *args,
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def check_summary(s: dict, tmp_path: Path) -> None:
    assert s["simulated"] is True and s["ok"] is True and s["failure_class"] is None
    assert s["candidate"] == 0 and s["N"] == 32
    assert 0 < s["step_p50_s"] <= s["step_p95_s"] <= s["step_p99_s"]
    assert s["tokens_per_s_per_gpu"] > 0 and 0 < s["mfu"] < 1
    assert s["heaviest_rank"] is not None and s["peak_memory_gb"] > 0
    assert s["token_drop_fraction"] == 0.0 and s["measure_iters"] == 10 and not s["partial"]
    job = Path(s["job_dir"])
    assert job.is_relative_to(tmp_path / "runs") and job.name == "attempt-1"
    saved = json.loads((job / "result.json").read_text())
    assert saved["simulated"] is True and saved["step_p50_s"] == s["step_p50_s"]
    assert (job / "job.json").exists() and list(job.glob("rank-*.out"))


@pytest.mark.long
def test_run_one_local_json(tmp_path):
    proc = run_one(tmp_path, "--candidate", "0", "cluster=local", "--format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    check_summary(s, tmp_path)
    assert s["cluster"] == "local"
    # The measured (simulated) step time is not the planner's: the twin's truth differs on purpose (by 4.4% on the
    # smoke stage's candidate 0 once the step model charged the dispatchers' copies and short-K GEMMs; 5% before).
    assert abs(s["step_p50_s"] / s["predicted_step_s"] - 1) > 0.01
    # A second run of the same candidate is attempt 2, in its own folder.
    again = run_one(tmp_path, "--candidate", "0", "cluster=local", "--format", "json")
    assert json.loads(again.stdout)["job_dir"].endswith("attempt-2")


@pytest.mark.long
def test_run_one_table_has_simulated_banner(tmp_path):
    proc = run_one(tmp_path, "--candidate", "1", "cluster=local")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIMULATED" in proc.stdout and "step time p50" in proc.stdout


def test_run_one_bad_index_is_a_user_error(tmp_path):
    proc = run_one(tmp_path, "--candidate", "100000", "cluster=local")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: --candidate 100000 is out of range")


@pytest.mark.long
def test_run_one_reports_oom(tmp_path):
    proc = run_one(tmp_path, "--candidate", "0", "cluster=local", "--format", "json", "++workload.twin.force_oom=true")
    assert proc.returncode == 1
    s = json.loads(proc.stdout)
    assert s["failure_class"] == "OOM" and s["simulated"] is True and not s["ok"]
    assert "CUDA out of memory" in s["failure_detail"]


@pytest.mark.slurm
def test_run_one_on_slurm(tmp_path, slurm_cluster):
    """32 tasks over 4 nodes x 8 fake GPUs: ranks from Slurm, the last rank prints the iterations."""
    proc = run_one(tmp_path, "--candidate", "0", "cluster=slurm", "--format", "json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    check_summary(s, tmp_path)
    assert s["cluster"] == "slurm" and s["job_id"]
    job = JobPaths(s["job_dir"])
    # Evidence ranks keep their own file; every other rank's lines are in its node's log, labelled.
    evidence = evidence_ranks(Layout.from_dict(json.loads(job.spec.read_text())["layout"]), 32)
    assert {JobPaths.rank_of(p) for p in job.folder.glob("rank-*.out")} == set(evidence)
    labelled = {int(line.split(":", 1)[0]) for p in job.node_logs() for line in p.read_text().splitlines()}
    assert labelled == set(range(32)) - evidence
    assert s["result"]["slurm_state"] == "COMPLETED"


def test_build_spec_and_time_limit():
    """The spec a job gets: flags for warmup + measure iterations, merged env, FLOPs, predicted step."""
    import dataclasses

    from orchestrator.config import compose
    from orchestrator.plan import planner
    from orchestrator.plan.argv import layout_from_argv, parse_flags
    from orchestrator.runspec import TIME_SAFETY, build_spec, time_limit_min

    cfg = compose(["+stage=smoke", "++workload.env.FOO=bar"]).cfg
    planned = planner.plan(cfg.model, cfg.hardware, cfg.stage).candidates[0]
    spec = build_spec(cfg, planned, sweep="s", attempt=2, job_dir="/tmp/x")
    flags = parse_flags(spec.argv)
    assert flags["train_iters"] == cfg.stage.warmup_iters + cfg.stage.measure_iters
    assert layout_from_argv(spec.argv) == planned.layout and spec.layout == planned.layout.to_dict()
    assert spec.env["FOO"] == "bar" and spec.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert spec.model_flops_per_step == pytest.approx(planned.prediction.flops_per_step)
    assert spec.predicted["step_time_s"] == planned.prediction.step_time_s and spec.n_gpus == 32
    # Short steps: the floor; long steps: iterations x step x safety + margin, rounded up.
    assert time_limit_min(spec, cfg.cluster) == max(cfg.cluster.min_time_min, cfg.cluster.time_margin_min + 1)
    spec.predicted["step_time_s"] = 60.0
    iters = cfg.stage.warmup_iters + cfg.stage.measure_iters
    assert time_limit_min(spec, cfg.cluster) == int(iters * TIME_SAFETY) + cfg.cluster.time_margin_min
    assert time_limit_min(spec, dataclasses.replace(cfg.cluster, min_time_min=10_000)) == 10_000
