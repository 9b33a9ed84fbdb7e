"""The HTML report: gathered from a real ledger (SQLite and PostgreSQL), rendered, and checked in
headless Chromium (Debian's chromium) so the plots and the ranked table are really on the page."""

from __future__ import annotations

import html
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.core import knobs
from orchestrator.core.result import JobResult
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import CandidateIn, Ledger
from orchestrator.plan.layout import Layout, canonical_key
from orchestrator.report.data import ReportData, gather
from orchestrator.report.decision import decide
from orchestrator.report.html import FIRST_SCREEN, render, report
from tests.sweeplib import cli, ledger_url, sweep_args


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
        a = ledger.new_attempt(c.id, job_id=str(1000 + i), job_dir=f"/nonexistent/j{i}", simulated=True)
        if i == 5:  # one OOM, shown in the failed table
            ledger.update_attempt(a.id, state="FAILED", failure_class="OOM", exit_code=1)
            ledger.set_candidate_status(c.id, "failed", "OOM")
            continue
        ledger.update_attempt(a.id, state="COMPLETED", exit_code=0)
        ledger.evidence.record_result(a.id, _result(1.1 + 0.13 * i, rng, peak=18 + 2 * (i % 3), drop=0.01 * i))
        ledger.set_candidate_status(c.id, "done")
    ledger.evidence.record_calibration("s1", 1, {"compute": 1.2, "a2a": 1.3}, {"mape_before": 0.2, "mape_after": 0.05})
    ledger.evidence.record_parity(
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
    with ledger.store.write() as s:  # link across sweeps the way the sweep loop records promoted-from edges
        from orchestrator.ledger import models as m

        s.get(m.Candidate, child.id).parent_id = rows[1].id
    a = ledger.new_attempt(child.id, job_id="2000", job_dir="/tmp/k", simulated=True)
    ledger.update_attempt(a.id, state="COMPLETED", exit_code=0)
    ledger.evidence.record_result(a.id, _result(0.7, rng, peak=15))
    ledger.set_candidate_status(child.id, "done")


@pytest.mark.long
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


def _chromium() -> str:
    chromium = shutil.which("chromium")
    if chromium is None:
        msg = "Debian's chromium is not installed (tests/cluster/services.sh installs it)"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    return str(chromium)


def _browse(tmp_path: Path, page: Path, *args: str) -> str:
    """Open `page` in headless Chromium at 1400 px wide: the DOM after its load script ran (--dump-dom), or
    whatever `args` ask for instead (--screenshot=...)."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=5000",
        "--window-size=1400,900",
    ]
    run = subprocess.run(
        [_chromium(), *flags, *(args or ["--dump-dom"]), page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return run.stdout


def _no_sideways_scroll(dom: str) -> None:
    """The page's load script wrote the document's scroll width and every table box that overflows."""
    root = re.search(r"<html[^>]*>", dom)
    assert root, dom[:300]
    attrs = dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', root.group(0)))
    assert int(attrs["data-scroll-width"]) <= min(1400, int(attrs["data-client-width"])), attrs
    assert attrs["data-overflowing"] == "", attrs  # no table scrolls inside its own box either


@pytest.mark.long
def test_decision_is_bests_choice_and_the_ranked_table_follows_it(tmp_path):
    """The headline names the candidate `best` picks (candidate 0 is fastest but failed parity), the margin is
    to the next eligible one, and without a composable stored config the page says why there are no flags."""
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        d = gather(ledger, "s1")
        dec = decide(ledger, d)
        hit = queries.best(ledger, sweep="s1")
        page = render(d, tmp_path / "out", dec).read_text()
    assert hit and dec.best and dec.runner_up and dec.best["candidate_id"] == hit["candidate_id"]
    assert d.measured[0]["parity"] is False and dec.best is d.measured[1] and dec.runner_up is d.measured[2]
    assert dec.margin == pytest.approx(d.measured[2]["step_p50_s"] / d.measured[1]["step_p50_s"] - 1)
    assert f"{100 * dec.margin:.1f}% faster" in page and knobs.label(dec.best) in page
    assert dec.flags == "" and "id='flags-missing'" in page  # the test ledger's config has no full stage
    ranked = re.search(r'<table id="ranked">.*?</table>', page, re.S)
    assert ranked and re.search(r'<tr class="best"[^>]*><td class="l">2</td><td>2</td>', ranked.group(0))
    assert ranked.group(0).count('class="excluded"') == 1  # the failed-parity row
    for r in d.measured:  # the same evidence from GPUs: the headline says MEASURED, never SIMULATED
        r["simulated"] = False
    d.simulated = False
    card = re.search(r"<section id='decision'.*?</section>", render(d, tmp_path / "m", dec).read_text(), re.S)
    assert card and "MEASURED" in card.group(0) and "SIMULATED" not in card.group(0)


def test_a_sweep_without_results_has_no_recommendation(tmp_path):
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _sweep(ledger, "empty", "smoke", 32)
        d = gather(ledger, "empty")
        dec = decide(ledger, d)
        page = render(d, tmp_path / "out", dec).read_text()
    assert dec.best is None and dec.margin is None and "No recommended layout yet" in page and "id='flags'" not in page


@pytest.mark.long
def test_calibration_table_is_formatted_and_empty_series_say_so(tmp_path):
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        ledger.evidence.record_calibration(
            "s1",
            2,
            {
                "method": "ratio",
                "factors": {"compute": 1.4135257597691362, "a2a": 1.4135257597691362},
                "memory_factor": 0.9270233496182,
                "n_step": 6,
                "n_oom": 1,
                "mape_before": 0.4096685394530862,
            },
            {"step_mape_after": 0.1903005286040771, "step_loo_mape": 0.19241656639108473},
        )
        d = gather(ledger, "s1")
        for r in d.measured:
            r["token_drop_fraction"] = 0.0
        page = render(d, tmp_path / "out", decide(ledger, d)).read_text()
    cal = re.search(r'<table id="calibration">.*?</table>', page, re.S)
    assert cal
    text = cal.group(0)
    assert "×1.41 (all 2 components)" in text and "×0.927" in text and "compute 1.2; a2a 1.3" in text
    assert "41.0% → 19.0% (leave-one-out 19.2%)" in text and "6 step, 1 OOM" in text
    assert not re.search(r"\d\.\d{6}", text)  # no raw 16-digit floats
    assert "Token drop: no drops measured" in page
    assert "No promoted lineage" in page  # s1 has no parent stage: the scaling figure says why it is empty


@pytest.mark.chromium
def test_page_renders_in_headless_chromium(tmp_path):
    _chromium()
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        d = gather(ledger, "s1")
        path = render(d, tmp_path / "out", decide(ledger, d))
    assert {p.name for p in (tmp_path / "out").glob("*.png")} >= {"step-cdf.png", "pareto.png", "calibration.png"}
    dom = _browse(tmp_path, path)
    widths = [int(w) for w in re.findall(r'data-natural-width="(\d+)"', dom)]
    assert len(widths) >= 4 and all(w > 100 for w in widths), widths  # every figure decoded
    assert dom.count("<tr") >= 1 + 7 and 'id="ranked"' in dom and "SIMULATED" in dom
    _no_sideways_scroll(dom)


def _planner_index(key: str) -> int:
    """The candidate index `plan +stage=smoke --argv N` takes for the layout with this ledger key."""
    from orchestrator.config import compose
    from orchestrator.plan.planner import plan

    cfg = compose(["+stage=smoke"]).cfg
    assert cfg.stage is not None
    res = plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name, recipe=cfg.workload.recipe)
    return next(i for i, p in enumerate(res.candidates) if p.key == key)


@pytest.mark.chromium
def test_a_twin_sweeps_report_opens_on_the_decision_at_1400px(tmp_path):
    """The must-show: a real twin sweep (the CLI, local executor), its report in Chromium at 1400 px: the
    headline names `best`'s layout with its margin and evidence, the flags block holds exactly what
    `plan --argv` prints for that layout, and nothing scrolls sideways. The first screen is kept as a PNG."""
    _chromium()
    run = cli("sweep", *sweep_args(tmp_path, "first-hour"), timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    with Ledger.open(ledger_url(tmp_path), create=False) as ledger:
        hit = queries.best(ledger, sweep="first-hour")
        d: ReportData = gather(ledger, "first-hour")
        path = report(ledger, "first-hour", tmp_path / "report")
    assert hit is not None and len(d.measured) >= 2
    dom = _browse(tmp_path, path)
    _no_sideways_scroll(dom)
    first = re.search(r'<html[^>]*data-first-screen="([^"]*)"', dom)
    assert first and first.group(1).split("|") == list(FIRST_SCREEN), first  # all whole in the 1400x900 window
    decision = re.search(r"<section id=\"decision\".*?</section>", dom, re.S)
    assert decision, dom[:2000]
    head = html.unescape(re.sub(r"<[^>]+>", " ", decision.group(0)))
    layout = re.search(r'id="recommended-layout">([^<]*)<', decision.group(0))
    assert layout and html.unescape(layout.group(1)) == Layout.from_dict(hit["layout"]).short()
    best = next(r for r in d.measured if r["candidate_id"] == hit["candidate_id"])
    runner = min(
        (r for r in d.measured if r is not best and r.get("parity") is not False), key=lambda r: r["step_p50_s"]
    )
    assert f"{100 * (runner['step_p50_s'] / best['step_p50_s'] - 1):.1f}% faster" in head
    for evidence in ("SIMULATED", "p50", "p99", "token drop", "parity", f"job {best['job_id']}"):
        assert evidence in head, (evidence, head)
    assert re.search(r"\d+\.\d GB reserved of 141 GB HBM \(\d+%\)", head), head  # the smoke stage's H200
    pre = re.search(r'<pre id="flags">(.*?)</pre>', dom, re.S)
    assert pre and 'id="copy-flags"' in decision.group(0)
    argv = cli("plan", "+stage=smoke", "--argv", str(_planner_index(hit["key"])))
    assert argv.returncode == 0, argv.stderr
    assert html.unescape(pre.group(1)).strip() == argv.stdout.strip()
    shot = tmp_path / "first-screen-1400.png"
    _browse(tmp_path, path, f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000
    if os.environ.get("REPORT_SCREENSHOT"):  # keep a copy to look at: REPORT_SCREENSHOT=/some/file.png
        shutil.copy(shot, os.environ["REPORT_SCREENSHOT"])


@pytest.mark.long
def test_status_the_report_and_the_budget_charge_one_sweep_the_same_gpu_hours(tmp_path):
    """Issue 17's "four cost formulas": a sweep with a full, a screen and a probe attempt (an OOM that held its
    GPUs for 30 s) and a launch that never started. `status`, the report's GPU-hours per round and the budget
    check all charge what orchestrator.core.cost charges: start-up for every launch that ran, and each attempt
    its own window."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.commands import status
    from orchestrator.config import compose
    from orchestrator.search import make_policy
    from orchestrator.search.env import PlanEnv
    from orchestrator.sweep.decide import next_round
    from orchestrator.sweep.view import View

    composed = compose(["+stage=smoke", "cluster=local", "stage.budget.startup_s=60"])
    cfg, n = composed.cfg, composed.cfg.stage.gpus
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        ledger.create_or_get_sweep(
            "cost", stage="smoke", config_yaml=composed.to_yaml(), model="tiny", hardware="h200", workload="twin",
            provenance={},
        )  # fmt: skip
        lays = [Layout(pp=1, ep=e) for e in (4, 8, 16, 32)]
        rows = ledger.add_candidates(
            "cost", [CandidateIn(key=f"k{i}", layout=lay.to_dict(), round=min(i, 1)) for i, lay in enumerate(lays)]
        )
        runs = [("full", 5, 10, 2.0), ("screen", 2, 4, 1.5)]
        for c, (fid, warm, meas, step) in zip(rows, runs, strict=False):
            a = ledger.new_attempt(c.id, job_id=f"j{c.id}", job_dir="-", simulated=True, fidelity=fid)
            res = dict(_result(step, random.Random(c.id), peak=20.0), warmup_iters=warm, measure_iters=meas)
            ledger.evidence.record_result(a.id, dict(res, measure_iters_requested=meas, step_mean_s=step))
            ledger.set_candidate_status(c.id, "done")
        probe = ledger.new_attempt(rows[2].id, job_id="p", job_dir="-", simulated=True, fidelity="probe")
        ledger.update_attempt(probe.id, state="OUT_OF_MEMORY", start_time=t0, end_time=t0 + timedelta(seconds=30))
        ledger.set_candidate_status(rows[2].id, "failed", "OOM")
        never = ledger.new_attempt(rows[3].id, job_id="c", job_dir="-", simulated=True)
        ledger.update_attempt(never.id, state="CANCELLED")
        ledger.set_candidate_status(rows[3].id, "cancelled")
        expected = n * ((60 + 2.0 * 15) + (60 + 1.5 * 6) + (60 + 30)) / 3600

        by_status = status.gather(ledger, "cost")["gpu_hours"]
        by_report = gather(ledger, "cost").rounds[-1]["gpu_hours"]
        cfg.stage.budget.max_gpu_hours = expected
        env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)
        stop = next_round(ledger, cfg, ledger.get_sweep("cost"), make_policy(cfg.policy), env, View(live=False))
    assert by_status == pytest.approx(expected) and by_report == pytest.approx(expected)
    assert stop == f"budget spent: {expected:.1f}/{expected:.0f} simulated GPU-hours"


def _times(p50: float, cv: float, n: int = 50) -> list[float]:
    """n step times with median p50 and robust CV cv (normal quantiles: no randomness to flake on)."""
    from statistics import NormalDist

    z = [NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)]
    return [p50 * (1 + cv * q) for q in z]


def _two(best_p50: float, runner_p50: float, *, best_p99: float = 1.2, runner_p99: float = 1.2):
    from orchestrator.report.decision import Decision, p50_interval

    best = {"candidate_id": 1, "step_p50_s": best_p50, "step_p99_s": best_p99}
    runner = {"candidate_id": 2, "step_p50_s": runner_p50, "step_p99_s": runner_p99, "pp": 2}
    return Decision(
        best=best,
        runner_up=runner,
        flags="",
        flags_source="",
        hbm_gb=None,
        best_interval=p50_interval(best_p50, _times(best_p50, 0.03)),
        runner_interval=p50_interval(runner_p50, _times(runner_p50, 0.03)),
    )


def test_a_tie_only_when_the_p50_intervals_overlap():
    """50 steps at 3% noise bound each p50 to about +-1%: 0.5% apart is a tie, 5% apart is not (both ways)."""
    from orchestrator.report import sections

    close, apart = _two(1.0, 1.005), _two(1.0, 1.05)
    assert close.best_interval and close.runner_interval and close.runner_interval[0] < close.best_interval[1]
    assert close.within_noise and "treat as a tie" in sections._separation(close)
    assert not apart.within_noise and "treat as a tie" not in sections._separation(apart)
    assert "do not overlap" in sections._separation(apart)
    from orchestrator.report.decision import Decision

    unknown = Decision(best=close.best, runner_up=close.runner_up, flags="", flags_source="", hbm_gb=None)
    assert not unknown.within_noise and "treat as a tie" not in sections._separation(unknown)


def test_a_much_better_runner_up_p99_is_named():
    """0.9% slower p50 but p99 63.4 s against 81.9 s (issue 21's case): the recommendation names the p99."""
    worse_tail = _two(72.0, 72.65, best_p99=81.9, runner_p99=63.4)
    assert worse_tail.p99_gain == pytest.approx(1 - 63.4 / 81.9)
    assert _two(1.0, 1.05, best_p99=1.2, runner_p99=1.15).p99_gain is None  # 4% lower is not "much"


@pytest.mark.long
def test_the_report_states_spend_rounds_budget_and_why_it_stopped(tmp_path):
    """The decision card carries the same GPU-hours `status` prints, the budget, the rounds and the stop event;
    the recommended layout's parity row names another layout's key (never its own), else says NOT CHECKED."""
    from orchestrator.commands import status
    from orchestrator.config import compose
    from orchestrator.core.price import SweepPrice

    composed = compose(["+stage=smoke", "cluster=local"])
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        with ledger.store.write() as s:  # a stored config that composes: the smoke stage's budget
            from orchestrator.ledger import models as m

            s.query(m.Sweep).filter_by(name="s1").one().config_yaml = composed.to_yaml()
        # the whole sweep's price, as a sweep keeps it in its provenance at its start (sweep/price.py)
        ledger.add_provenance("s1", "price", SweepPrice(5.0, 2.0, 9.0, 0.2, (4.0, 6.0), 32).to_dict())
        ledger.log_event("s1", "stop", "max_rounds 2 reached")
        d = gather(ledger, "s1")
        dec = decide(ledger, d)
        by_status = status.gather(ledger, "s1")["gpu_hours"]
        page = render(d, tmp_path / "out", dec).read_text()
        assert dec.best is not None
        rows = ledger.evidence.parity(d.measured[0]["candidate_id"])
    assert (
        d.spend
        and d.spend.gpu_hours == pytest.approx(by_status)
        and d.rounds[-1]["gpu_hours"] == pytest.approx(by_status)
    )
    budget = composed.cfg.required_stage().budget
    spend = re.search(r"<p class='note' id='spend'>(.*?)</p>", page, re.S)
    assert spend, page[:3000]
    text = html.unescape(re.sub(r"<[^>]+>", "", spend.group(1)))
    assert f"{by_status:,.1f} simulated GPU-hours of the {budget.max_gpu_hours:,.0f} budgeted" in text
    assert f"of {budget.max_rounds} rounds" in text and "Stopped: max_rounds 2 reached" in text
    assert f"Price: spent {by_status:.2g} GPU-h of an expected 5 (90%: 2-9, simulated)" in text, text
    assert rows and rows[-1].reference_key != d.measured[0]["key"]  # the one parity row compares two layouts
    assert "NOT CHECKED" in re.search(r"id='parity-verdict'>[^<]*", page).group(0)  # the best has no parity row


def _overlaps(texts) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes intersect (a label printed over another)."""
    boxes = [(t.get_text(), t.get_window_extent()) for t in texts if t.get_visible() and t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1 :] if ba.overlaps(bb)]


@pytest.mark.long
def test_predicted_vs_measured_labels_do_not_print_over_each_other(tmp_path):
    """Issue 49: the two panels' x-axis labels ran into each other. Every axis label, tick label and title of
    the figure is drawn clear of every other."""
    from orchestrator.report import plots

    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        d = gather(ledger, "s1")
    for r in d.measured:  # predictions in the thousands: wide tick labels, as at scale
        r["pred_step_s"], r["pred_memory_gb"] = 1000 * r["step_p50_s"] * 1.3, 130.0 + r["candidate_id"]
        r["step_p50_s"] *= 1000
    fig = plots.calibration_figure(d)
    assert fig is not None
    fig.canvas.draw()
    labels = [fig._suptitle] if fig._suptitle else []
    ticks = []
    for ax in fig.axes:
        labels += [ax.xaxis.label, ax.yaxis.label, ax.title]
        lo, hi = ax.get_xlim()
        xt = [t for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]  # the drawn ones
        assert not _overlaps(xt), _overlaps(xt)  # tick labels side by side, none over the next
        ticks += xt
    said = _overlaps(labels + ticks)
    assert not said, said  # no axis label, title or tick label over another (the two panels' alike)


@pytest.mark.long
def test_strong_scaling_bars_are_labelled_by_candidate_number(tmp_path):
    """Issue 49: the scaling figure's bars carried whole layout strings, rotated; now the candidate's number,
    upright, which the "Promoted lineages" table maps to its layout."""
    from orchestrator.report import plots

    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        d = gather(ledger, "s2")
        page = render(d, tmp_path / "out", decide(ledger, d)).read_text()
    (lin,) = d.lineage
    fig = plots.scaling_figure(d)
    assert fig is not None
    ticks = fig.axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == [f"#{lin.candidate_id}"] and all(t.get_rotation() == 0 for t in ticks)
    table = re.search(r'<table id="lineage">.*?</table>', page, re.S)
    assert table and f"#{lin.candidate_id}" in table.group(0) and html.escape(lin.label) in table.group(0)


@pytest.mark.long
def test_calibration_memory_is_a_readable_cell_and_the_flags_point_at_training(tmp_path):
    """Issue 49: the calibration table dumped the memory fit's field names (memory_method, memory_factors,
    memory_band); the flags box said to set --train-iters instead of naming `best --flags --train`."""
    from orchestrator.config import compose

    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        with ledger.store.write() as s:  # a stored config that composes: the flags are built from it
            from orchestrator.ledger import models as m

            s.query(m.Sweep).filter_by(name="s1").one().config_yaml = compose(["+stage=smoke"]).to_yaml()
        fit = {"method": "components", "factors": {"compute": 1.2}, "memory_factor": 1.0, "n_step": 4}
        fit |= {"memory_method": "terms", "memory_factors": {"weights": 1.0, "activations": 1.25}}
        fit |= {"memory_band": 0.08, "memory_loo_mape": 0.05}
        ledger.evidence.record_calibration("s1", 3, fit, {"memory_mape_before": 0.2, "memory_mape_after": 0.04})
        d = gather(ledger, "s1")
        page = render(d, tmp_path / "out", decide(ledger, d)).read_text()
        text = html.unescape(re.search(r'<table id="calibration">.*?</table>', page, re.S).group(0))
        assert "per term: weights ×1, activations ×1.25; band ±8%" in text, text
        assert "memory_" not in text and "20.0% → 4.0% (leave-one-out 5.0%)" in text
        from orchestrator.report.decision import _flags

        pp2 = next(c for c in ledger.candidates("s1") if c.layout.pp == 2)  # its pattern has PP x VPP segments
        flags, source = _flags(ledger, "s1", pp2.id, compose(["+stage=smoke"]).cfg, "", None)
    assert flags.lstrip().startswith("--") and "--train-iters is" not in source
    assert "to train with this layout, `python -m orchestrator best --sweep s1 --flags --train`" in source, source


@pytest.mark.long
def test_a_best_that_is_its_own_reference_reads_not_checked_without_sending_anyone_to_run_the_slice(tmp_path):
    """Issue 49: a slice sweep's report told its reader to "run +stage=slice" when the best (CP1) is its own
    reference. The gate ran and had nothing to compare with: the page says NOT CHECKED with that reason, never
    "passed", and no command that would only run the same gate again."""
    with Ledger.open(f"sqlite:///{tmp_path / 'l.sqlite'}") as ledger:
        _fill(ledger)
        d = gather(ledger, "s1")
        best = decide(ledger, d).best
        assert best is not None
        why = f"not compared: {knobs.label(best)} is the reference layout itself"
        ledger.evidence.record_parity(
            best["candidate_id"],
            reference_key="",
            steps=0,
            max_loss_diff=0.0,
            max_grad_norm_diff=0.0,
            tolerance=0.002,
            passed=True,
            detail=why,
        )
        d = gather(ledger, "s1")
        page = render(d, tmp_path / "out", decide(ledger, d)).read_text()
    verdict = html.unescape(re.search(r"id='parity-verdict'>[^<]*", page).group(0))
    assert "NOT CHECKED" in verdict and why in verdict and "passed" not in verdict
    assert "+stage=slice" not in page and "parity.enabled=true" not in verdict
