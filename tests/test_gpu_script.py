"""The CPU-checkable parts of the one-GPU check (tests/gpu/run.sh): its shell syntax, the marker's skip on a
machine without CUDA, and the exact command it runs composing and planning here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestrator.commands.plan import megatron_flags
from orchestrator.config import compose
from orchestrator.plan import planner
from tests.gpu.test_megatron_gpu import STAGE, TOPK, run_one_command

ROOT = Path(__file__).resolve().parent.parent


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
