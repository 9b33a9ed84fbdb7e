"""Finalists end to end on cluster=local with a SQLite ledger: three slice-stage candidates are measured,
the correctness gate runs (CP4 carries an injected numerical bug), a failing candidate is excluded and
never `best`, and a long-run window stores Q_effective that `compare --sort q_effective` ranks.
Ledger.update_result_metrics runs on both engines."""

from __future__ import annotations

import dataclasses
import json

import pytest

from orchestrator import runspec
from orchestrator.config import compose
from orchestrator.launch.auto import make_launcher
from orchestrator.ledger import queries
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.ledger import CandidateIn, Ledger
from orchestrator.plan import planner
from orchestrator.plan.layout import Layout
from orchestrator.sweep import finalists, observe
from tests.sweeplib import cli

SWEEP = "fin"
LAYOUTS = [Layout(cp=cp, ep=32) for cp in (1, 2, 4)]  # slice stage, PP1: the reference is CP1


def _cfg(tmp_path):
    return compose(
        [
            "+stage=slice",
            "cluster=local",
            f"cluster.folder={tmp_path / 'runs'}",
            f"ledger.url=sqlite:///{tmp_path / 'ledger.sqlite'}",
            "++cluster.poll_interval_s=0.2",
            "++workload.twin.time_scale=0.00001",
            "++workload.twin.max_sleep_s=0.001",
            "++workload.twin.diverge_when={cp: 4}",
            "++effective.long_run_save_at=4",
            "++effective.long_run_after_iters=6",
        ]
    ).cfg


def _sweep(led: Ledger, cfg, layouts):
    led.create_or_get_sweep(
        SWEEP,
        stage=cfg.stage.name,
        config_yaml="",
        model=cfg.model.name,
        hardware=cfg.hardware.name,
        workload=cfg.workload.name,
        provenance={},
    )
    items = []
    for lay in layouts:
        pl = planner.evaluate(cfg.model, cfg.hardware, cfg.stage, lay, workload=cfg.workload.name)
        assert isinstance(pl, planner.Planned), pl
        items.append(
            CandidateIn(
                key=pl.key,
                layout=pl.layout.to_dict(),
                layer_pattern=pl.prediction.layer_pattern,
                predicted=dataclasses.asdict(pl.prediction),
            )
        )
    return led.add_candidates(SWEEP, items), items


def _measure(cfg, led: Ledger, launcher, cands):
    """The measurement attempts the sweep loop would have made (same specs, launcher, collect, ledger calls)."""
    specs = []
    for c in cands:
        pl = planner.evaluate(cfg.model, cfg.hardware, cfg.stage, Layout.from_dict(c.layout), workload="twin")
        specs.append(runspec.build_spec(cfg, pl, sweep=SWEEP, attempt=1))
    results = finalists.run_jobs(cfg, led, launcher, SWEEP, specs, kind="measure")
    for c, spec, res in zip(cands, specs, results):
        assert res.ok, res.failure_detail
        a = led.new_attempt(c.id, job_dir=spec.job_dir, simulated=True)
        led.record_result(a.id, res.to_dict())
        led.set_candidate_status(c.id, "done", "measured")
    return results


def test_parity_and_long_run_end_to_end(tmp_path):
    cfg = _cfg(tmp_path)
    launcher, _ = make_launcher(cfg.cluster)
    with Ledger.open(cfg.ledger.url) as led:
        cands, _ = _sweep(led, cfg, LAYOUTS)
        measured = _measure(cfg, led, launcher, cands)
        by_cp = {c.layout["cp"]: c for c in cands}

        rows = finalists.run_parity(cfg, led, launcher, SWEEP, cands)
        assert [r.candidate_id for r in rows] == [c.id for c in cands]
        cp1, cp2, cp4 = rows
        assert cp1.passed and cp1.steps == 0 and "reference layout itself" in cp1.detail
        assert cp2.passed and cp2.steps == cfg.parity.steps and cp2.max_loss_diff < cfg.parity.loss_rtol
        assert cp2.reference_key == by_cp[1].key  # CP2's reference is the CP1 layout
        assert not cp4.passed and cp4.max_loss_diff > cfg.parity.loss_rtol and "step" in cp4.detail
        assert all(led.parity(c.id) for c in cands)
        status = {c.layout["cp"]: (c.status, c.reason) for c in led.candidates(SWEEP)}
        assert status[4][0] == "excluded" and "parity failed" in status[4][1]
        assert status[1][0] == status[2][0] == "done"
        assert len(led.events(SWEEP, kind="parity")) >= 3
        # best never returns the excluded candidate: it is the fastest of those that passed
        best = queries.best(led, sweep=SWEEP)
        passing = [(m.step_p50_s, c.key) for c, m in zip(cands, measured) if c.layout["cp"] != 4]
        assert best["key"] == min(passing)[1] != by_cp[4].key

        info = finalists.run_long_run(cfg, led, launcher, SWEEP, led.candidate_by_key(SWEEP, by_cp[2].key))
        assert info["ok"], info
        stored = led.result(info["attempt_id"])
        for k in ("ckpt_save_s", "ckpt_restore_s", "tokens_per_s_after_restart", "effective_fraction", "q_effective"):
            assert stored[k] == pytest.approx(info[k]) and stored[k] > 0, k
        assert stored["q_effective"] < stored["tokens_per_s"] and stored["effective_fraction"] < 1
        assert stored["tokens_per_s"] == pytest.approx(measured[1].tokens_per_s)  # steady figure kept
        ev = led.events(SWEEP, kind="long-run", candidate_id=by_cp[2].id)
        assert len(ev) == 1 and "Q_effective" in ev[0].message
        # every finalist job (parity pairs, the long-run save + restore) charges the sweep's budget
        costs = led.events(SWEEP, kind="finalist-cost")
        assert {e.data["role"] for e in costs} >= {"parity", "long-run-save", "long-run-restore"}
        spent = observe.spent(led, SWEEP, stage=cfg.stage)
        charged = sum(e.data["gpu_hours"] for e in costs)
        assert charged > 0 and spent.by_fidelity["finalists"] == pytest.approx(charged)

    proc = cli(
        "compare",
        "--sweep",
        SWEEP,
        "--sort",
        "q_effective",
        "--format",
        "json",
        "--columns",
        "key,cp,status,q_effective,ckpt_save_s,ckpt_restore_s",
        f"ledger.url={cfg.ledger.url}",
    )
    assert proc.returncode == 0, proc.stderr
    table = json.loads(proc.stdout)
    q = [r["q_effective"] for r in table]
    assert q == sorted(q, reverse=True) and len(table) == 3  # best first
    row = next(r for r in table if r["key"] == by_cp[2].key)
    assert row["q_effective"] == pytest.approx(info["q_effective"]) and row["ckpt_save_s"] > 0


def test_parity_with_an_illegal_reference_fails_without_running(tmp_path):
    cfg = dataclasses.replace(_cfg(tmp_path), parity=dataclasses.replace(_cfg(tmp_path).parity, reference={"ep": 7}))
    with Ledger.open(cfg.ledger.url) as led:
        cands, _ = _sweep(led, cfg, LAYOUTS[1:2])
        (row,) = finalists.run_parity(cfg, led, None, SWEEP, cands)  # no launcher needed: nothing runs
        assert not row.passed and "reference" in row.detail and "no reference to compare with" in row.detail
        assert led.candidates(SWEEP)[0].status == "excluded"


def test_update_result_metrics(ledger_url):
    with Ledger.open(ledger_url) as led:
        led.create_or_get_sweep(
            "u", stage="smoke", config_yaml="", model="tiny", hardware="h200", workload="twin", provenance={}
        )
        (c,) = led.add_candidates("u", [CandidateIn(key="k1", layout=Layout(ep=8).to_dict())])
        ok = led.new_attempt(c.id, job_dir="/tmp/a1", simulated=True)
        led.record_result(ok.id, {"ok": True, "simulated": True, "step_p50_s": 1.5, "tokens_per_s": 1000.0})
        after = led.update_result_metrics(ok.id, ckpt_save_s=2.5, q_effective=900.0, effective_fraction=0.9)
        assert after["ckpt_save_s"] == 2.5 and after["q_effective"] == 900.0 and after["tokens_per_s"] == 1000.0
        assert led.result(ok.id)["effective_fraction"] == 0.9
        with pytest.raises(LedgerError, match="not updatable"):
            led.update_result_metrics(ok.id, nonsense=1.0)
        with pytest.raises(LedgerError, match="not updatable"):
            led.update_result_metrics(ok.id, timers_ms={})
        failed = led.new_attempt(c.id, job_dir="/tmp/a2", simulated=True)
        with pytest.raises(LedgerError, match="no stored result"):
            led.update_result_metrics(failed.id, q_effective=1.0)


def test_run_finalists_gates_then_runs_long_windows_once(tmp_path):
    cfg = _cfg(tmp_path)
    cfg = dataclasses.replace(
        cfg,
        effective=dataclasses.replace(cfg.effective, long_run=True),
        policy=dataclasses.replace(cfg.policy, promote_top_k=3),
    )
    launcher, _ = make_launcher(cfg.cluster)
    with Ledger.open(cfg.ledger.url) as led:
        cands, _ = _sweep(led, cfg, LAYOUTS)
        _measure(cfg, led, launcher, cands)
        by_cp = {c.layout["cp"]: c for c in cands}
        beats = []
        out = finalists.run_finalists(cfg, led, launcher, SWEEP, on_poll=lambda: beats.append(1))
        assert len(beats) >= 3  # the loop's heartbeat runs while parity and both long-run jobs are awaited
        assert set(out["finalists"]) == {c.key for c in cands}
        assert out["parity"] == {by_cp[1].id: True, by_cp[2].id: True, by_cp[4].id: False}
        assert set(out["long_run"]) == {by_cp[1].id, by_cp[2].id}  # the excluded candidate gets no window
        assert all(v["ok"] for v in out["long_run"].values())
        again = finalists.run_finalists(cfg, led, launcher, SWEEP)  # resumed: nothing runs twice
        assert again["parity"] == {} and again["long_run"] == {}
        assert by_cp[4].key not in again["finalists"]
