"""Real Megatron on one GPU through `run-one` (tests/gpu/run.sh): skipped without CUDA, so never under CI here.

What it proves that the twin cannot: the in-process path (orchestrator.job.megatron_run + orchestrator.job.instrument)
runs a
V4-shaped model, its iteration lines parse, the router hook counts tokens, the allocator peaks land in the
sidecar, and the memory model's prediction can be read beside the measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.paths import JobPaths


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU: run tests/gpu/run.sh")]

ROOT = Path(__file__).resolve().parents[2]
STAGE = "gpu1"  # conf/stage/gpu1.yaml: 1 GPU, tiny V4-shaped model cut to 4 blocks, 3 + 5 iterations
TOPK = 6  # conf/model/tiny.yaml moe_router_topk


def run_one_command(megatron: str | os.PathLike, folder: str | os.PathLike) -> list[str]:
    """The command the GPU check runs (its overrides are composed on CPU by tests/job/test_gpu_script.py)."""
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "run-one",
        f"+stage={STAGE}",
        "workload=megatron",
        "cluster=local",
        f"cluster.folder={folder}",
        f"workload.command=[python,{Path(megatron) / 'pretrain_hybrid.py'}]",
        "--format",
        "json",
    ]


def test_real_megatron_on_one_gpu(tmp_path):
    megatron = os.environ.get("MEGATRON_LM")
    if not megatron:
        pytest.fail("set MEGATRON_LM to a Megatron-LM dev-branch checkout (tests/gpu/run.sh says how)")
    proc = subprocess.run(
        run_one_command(megatron, tmp_path / "runs"), cwd=ROOT, capture_output=True, text=True, timeout=480
    )
    assert proc.stdout.strip(), f"run-one printed nothing; stderr:\n{proc.stderr[-4000:]}"
    s = json.loads(proc.stdout)
    r = s["result"]
    assert s["ok"], f"{s['failure_class']}: {s['failure_detail']} (job folder {s['job_dir']})"
    assert not s["simulated"]
    # Iteration lines parsed: the whole measured window.
    assert r["measure_iters"] == 5 and s["step_p50_s"] and s["step_p50_s"] > 0
    # Sidecar: router counts non-zero and consistent (dropless layout: every routed token is kept, and
    # routed = tokens x top-k), CUDA peaks recorded.
    sidecars = [json.loads(p.read_text()) for p in JobPaths(s["job_dir"]).sidecars()]
    assert sidecars, "no sidecar written"
    sc = sidecars[0]
    kept = sum(sc["tokens_per_expert"])
    assert kept > 0 and kept == sc["routed_tokens"] and not sc["dropped_tokens"]
    assert sc["routed_tokens"] % TOPK == 0
    assert sc["peak_allocated_mb"] and sc["peak_allocated_mb"] > 0 and sc["peak_reserved_mb"] >= sc["peak_allocated_mb"]
    print(
        f"\nmemory: predicted {s['predicted_memory_gb']:.2f} GB, measured peak {s['peak_memory_gb']:.2f} GB "
        f"(reserved); step p50 {s['step_p50_s']:.3f} s predicted {s['predicted_step_s']:.3f} s"
    )
