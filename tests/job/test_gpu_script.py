"""The CPU-checkable parts of the one-GPU check (tests/gpu/run.sh): its shell syntax, the marker's skip on a
machine without CUDA, and the exact command it runs composing and planning here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator.commands.plan import megatron_flags
from orchestrator.config import compose
from orchestrator.plan import planner
from tests.gpu.test_megatron_gpu import STAGE, TOPK, run_one_command

ROOT = Path(__file__).resolve().parents[2]


def test_run_sh_is_valid_bash_and_refuses_without_a_checkout(tmp_path):
    script = ROOT / "tests" / "gpu" / "run.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {"PATH": "/usr/bin:/bin", "MEGATRON_LM": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "error: no pretrain_hybrid.py" in proc.stderr


def test_gpu_tests_skip_without_cuda():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "1 skipped" in proc.stdout and "needs a CUDA GPU" in proc.stdout


def test_the_gpu_command_composes_and_plans_one_candidate(tmp_path):
    cmd = run_one_command(tmp_path / "megatron-lm", tmp_path / "runs")
    overrides = [a for a in cmd if "=" in a]
    cfg = compose(overrides, require_stage=True).cfg
    assert cfg.stage.name == STAGE and cfg.stage.gpus == 1 and cfg.workload.in_process
    assert cfg.workload.command[-1] == str(tmp_path / "megatron-lm" / "pretrain_hybrid.py")
    kept = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name).candidates
    assert kept, "the one-GPU stage must keep a candidate"
    argv = megatron_flags(cfg, cfg.stage, kept[0])
    value = {a: b for a, b in zip(argv, [*argv[1:], ""])}
    assert value["--tensor-model-parallel-size"] == value["--expert-model-parallel-size"] == "1"
    assert value["--moe-router-topk"] == str(TOPK) and "--mock-data" in argv


# ---- tests/gpu/device.sh + device_checks.py: the one-shot run on a lent GPU machine without TE or network ----

DEVICE_SH = ROOT / "tests" / "gpu" / "device.sh"
CHECKS = ROOT / "tests" / "gpu" / "device_checks.py"


def _checks(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECKS), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_device_sh_is_valid_bash_and_names_every_step_file():
    assert subprocess.run(["bash", "-n", str(DEVICE_SH)]).returncode == 0
    text = DEVICE_SH.read_text()
    # The files that come back (at most 8): every JSON the summary reads is written under $OUT.
    for name in ("imports.json", "argv.json", "gemm.json", "run_one.json", "job_tail.log", "summary.json"):
        assert f'"$OUT/{name}"' in text, name


def test_summary_reads_every_step_and_reports_failures(tmp_path):
    steps = tmp_path / "steps.tsv"
    steps.write_text("install\t0\t2\nrun-one\t1\t10\n")
    (tmp_path / "imports.json").write_text(json.dumps({"missing_required": [], "v4_backend_te_available": False}))
    (tmp_path / "run_one.json").write_text(json.dumps({"ok": False, "failure_class": "CRASH", "failure_detail": "x"}))
    (tmp_path / "gemm.json").write_text(json.dumps({"device": "d", "rows": [{"tokens_per_expert": 16}]}))
    proc = _checks("summary", str(tmp_path), "--steps", str(steps))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["steps"] == [{"step": "install", "rc": 0, "s": "2"}, {"step": "run-one", "rc": 1, "s": "10"}]
    assert doc["run_one"]["failure_class"] == "CRASH" and doc["v4_backend_te_available"] is False
    assert doc["gemm"]["rows"] == [{"tokens_per_expert": 16}] and doc["argv_verdict"] is None


def test_gemm_smoke_prints_measured_beside_the_planner(tmp_path):
    """Without CUDA the step refuses to report a figure; --smoke runs the same grouped-GEMM code on tiny
    shapes, and every row carries the planner's efficiency for that batch (steptime.expert_efficiency)."""
    from orchestrator.plan.steptime import expert_efficiency

    proc = _checks("gemm", str(tmp_path / "g.json"))
    doc = json.loads((tmp_path / "g.json").read_text())
    assert proc.returncode == 1 and doc["error"] == "no CUDA device: nothing measured" and not doc["rows"]
    proc = _checks("gemm", str(tmp_path / "s.json"), "--smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["planner"]["hidden"] == 7168 and doc["planner"]["moe_ffn"] == 3072  # ModelConfig (dsv4_pro)
    assert [r["tokens_per_expert"] for r in doc["rows"]] == [16, 32]
    for r in doc["rows"]:
        assert r["planner_efficiency"] == round(
            doc["planner"]["gemm_efficiency"] * expert_efficiency(r["tokens_per_expert"]), 3
        )
    assert "planner assumes" in proc.stdout
