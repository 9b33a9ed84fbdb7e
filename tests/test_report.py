"""The HTML report: gathered from a real ledger (SQLite and PostgreSQL), rendered, and checked in
headless Chromium (Debian's chromium) so the plots and the ranked table are really on the page."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess

import pytest
import yaml

from db.ledger import CandidateIn, Ledger
from jobs.result import JobResult
from orchestrator.plan.layout import Layout, canonical_key
from orchestrator.report.data import gather
from orchestrator.report.html import render


def _result(step: float, rng: random.Random, *, peak: float, drop: float = 0.0) -> dict:
    times = [step * rng.lognormvariate(0, 0.05) for _ in range(20)]
    s = sorted(times)
    r = JobResult(
        ok=True,
        simulated=True,
        warmup_iters=5,
        measure_iters_requested=20,
        measure_iters=20,
        step_times_s=times,
        step_p50_s=s[10],
        step_p95_s=s[18],
        step_p99_s=s[19],
        step_mean_s=sum(times) / 20,
        step_max_s=s[-1],
        tokens_per_s=64 * 4096 / s[10],
        tokens_per_s_per_gpu=64 * 4096 / s[10] / 32,
        mfu=0.3 / step,
        heaviest_rank=7,
        heaviest_pp_stage=0,
        peak_allocated_gb=peak,
        peak_reserved_gb=peak + 2,
        token_drop_fraction=drop,
        expert_load_p50=100.0,
        expert_load_p95=160.0,
        expert_load_p99=190.0,
        hot_expert_ratio=1.9,
        lm_loss=[2.0] * 20,
        grad_norm=[1.0] * 20,
    )
    return r.to_dict()


def _sweep(ledger: Ledger, name: str, stage: str, gpus: int) -> None:
    cfg = yaml.safe_dump({"stage": {"name": stage, "gpus": gpus}, "effective": {"checkpoint_interval_s": 1800.0}})
    ledger.create_or_get_sweep(
        name,
        stage=stage,
        config_yaml=cfg,
        model="tiny",
        hardware="h100",
        workload="twin",
        provenance={"project": "0.1.0", "megatron": "simulated (twin)"},
    )


def _fill(ledger: Ledger) -> None:
    rng = random.Random(7)
    _sweep(ledger, "s1", "smoke", 32)
    layouts = [Layout(pp=pp, ep=ep, cp=cp) for pp in (1, 2) for ep in (8, 16) for cp in (1, 2)]
    items = [
        CandidateIn(
            key=canonical_key(l, model="tiny", stage="smoke", hardware="h100", workload="twin"),
            layout=l.to_dict(),
            layer_pattern="CEHE|CEHE",
            round=i // 4,
            predicted={
                "step_time_s": 1.0 + 0.1 * i,
                "memory_gb": 20 + i,
                "d_a": 32 // l.pp // l.cp,
                "d_e": 32 // l.pp // l.ep,
                "m": 2,
                "bubble": 0.1,
                "feasible": True,
            },
        )
        for i, l in enumerate(layouts)
    ]
    rows = ledger.add_candidates("s1", items)
    for i, c in enumerate(rows):
        a = ledger.new_attempt(c.id, job_id=str(1000 + i), job_dir=f"/tmp/j{i}", simulated=True)
        if i == 5:  # one OOM, shown in the failed table
            ledger.update_attempt(a.id, state="FAILED", failure_class="OOM", exit_code=1)
            ledger.set_candidate_status(c.id, "failed", "OOM")
            continue
        ledger.update_attempt(a.id, state="COMPLETED", exit_code=0)
        ledger.record_result(a.id, _result(1.1 + 0.13 * i, rng, peak=18 + 2 * (i % 3), drop=0.01 * i))
        ledger.set_candidate_status(c.id, "done")
    ledger.record_calibration("s1", 1, {"compute": 1.2, "a2a": 1.3}, {"mape_before": 0.2, "mape_after": 0.05})
    ledger.record_parity(
        rows[0].id,
        reference_key=rows[1].key,
        steps=10,
        max_loss_diff=0.3,
        max_grad_norm_diff=0.1,
        tolerance=0.002,
        passed=False,
        detail="injected divergence",
    )
    # A later stage promoted from s1's second candidate.
    _sweep(ledger, "s2", "smoke8", 64)
    big = Layout(pp=1, ep=16, cp=2)
    child = ledger.add_candidates(
        "s2",
        [
            CandidateIn(
                key=canonical_key(big, model="tiny", stage="smoke8", hardware="h100", workload="twin"),
                layout=big.to_dict(),
                predicted={"step_time_s": 0.8, "m": 2},
                parent_key=None,
                edge_kind="promoted-from",
            )
        ],
    )[0]
    with ledger._write() as s:  # link across sweeps the way the sweep loop records promoted-from edges
        from db import models as m

        s.get(m.Candidate, child.id).parent_id = rows[1].id
    a = ledger.new_attempt(child.id, job_id="2000", job_dir="/tmp/k", simulated=True)
    ledger.update_attempt(a.id, state="COMPLETED", exit_code=0)
    ledger.record_result(a.id, _result(0.7, rng, peak=15))
    ledger.set_candidate_status(child.id, "done")


def test_gather_ranks_measured_and_excludes_failed_parity(ledger_url):
    with Ledger.open(ledger_url) as ledger:
        _fill(ledger)
        d = gather(ledger, "s1")
        steps = [r["step_p50_s"] for r in d.measured]
        assert steps == sorted(steps) and len(d.measured) == 7
        assert [r["failure_class"] for r in d.failed] == ["OOM"]
        # candidate 0 is fastest but failed parity: the best (delta 0) is the next one
        assert d.measured[0]["parity"] is False
        assert d.measured[1]["delta_vs_best"] == pytest.approx(0.0)
        assert all(r["q_effective"] < r["tokens_per_s"] for r in d.measured)
        assert d.simulated and d.rounds[-1]["gpu_hours"] > d.rounds[0]["gpu_hours"] > 0
        d2 = gather(ledger, "s2")
        (lin,) = d2.lineage
        assert (lin.parent_gpus, lin.child_gpus, lin.parent_sweep) == (32, 64, "s1")
        assert 0 < lin.efficiency < 1.5


def test_unknown_sweep_is_one_clear_error(tmp_path):
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        with pytest.raises(Exception, match="no sweep named 'nope'"):
            gather(ledger, "nope")


@pytest.mark.chromium
def test_page_renders_in_headless_chromium(tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        msg = "Debian's chromium is not installed (tests/cluster/services.sh installs it)"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        path = render(gather(ledger, "s1"), tmp_path / "out")
    assert {p.name for p in (tmp_path / "out").glob("*.png")} >= {"step-cdf.png", "pareto.png", "calibration.png"}
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=5000",
    ]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    widths = [int(w) for w in re.findall(r'data-natural-width="(\d+)"', dom)]
    assert len(widths) >= 4 and all(w > 100 for w in widths), widths  # every figure decoded
    assert dom.count("<tr") >= 1 + 7 and 'id="ranked"' in dom and "SIMULATED" in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, *flags, "--window-size=1400,1800", f"--screenshot={shot}", path.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 20_000
