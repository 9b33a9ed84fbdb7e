"""Finalists end to end on cluster=local with a SQLite ledger, driven by the sweep's own Driver: three
slice-stage candidates are measured, the search stops, the correctness gate runs (CP4 carries an injected
numerical bug) as attempts of their own role, a failing candidate is excluded and never `best`, and a
long-run window stores Q_effective that `compare --sort q_effective` ranks. Ledger.update_result_metrics and
the pick run on both engines."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from orchestrator import history
from orchestrator.config import compose
from orchestrator.core.spec import JobSpec
from orchestrator.core.states import AttemptRole, Fidelity
from orchestrator.launch.auto import make_launcher
from orchestrator.ledger import queries
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.ledger import CandidateIn, Ledger
from orchestrator.plan import planner
from orchestrator.plan.layout import Layout
from orchestrator.sweep import finalists
from orchestrator.sweep.loop import Driver
from orchestrator.sweep.view import View
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


def _drive(cfg, led: Ledger, layouts, *, launcher=None):
    """The real driver on a sweep whose round 0 is `layouts`: it measures them (stage slice: max_rounds 1), the
    search stops, and the finalists' jobs go through the same launch path as any attempt."""
    cands, _ = _sweep(led, cfg, layouts)
    launcher = launcher or make_launcher(cfg.cluster)[0]
    out = io.StringIO()
    outcome = Driver(led, cfg, led.get_sweep(SWEEP), launcher, View(live=False, stream=out)).run()
    assert outcome.reason == "max_rounds 1 reached", (outcome.reason, out.getvalue()[-2000:])
    return cands, {c.id: c for c in led.candidates(SWEEP)}, out.getvalue()


def _long(cfg, **policy):
    return dataclasses.replace(
        cfg,
        parity=dataclasses.replace(cfg.parity, enabled=True),
        effective=dataclasses.replace(cfg.effective, long_run=True),
        policy=dataclasses.replace(
            cfg.policy, search=dataclasses.replace(cfg.policy.search, **{"promote_top_k": 3, **policy})
        ),
    )


@pytest.mark.long
def test_parity_and_long_run_end_to_end(tmp_path):
    """Every finalist job is an attempt of its candidate with its role; verdicts and figures are derived from
    those attempts; none of them is ever the candidate's measurement; each is charged once, as an attempt."""
    cfg = _long(_cfg(tmp_path))
    with Ledger.open(cfg.ledger.url) as led:
        cands, after, log = _drive(cfg, led, LAYOUTS)
        by_cp = {c.layout.cp: c for c in cands}
        measured = {m.candidate_id: m for m in led.evidence.measured(sweep=SWEEP)}
        assert set(measured) == {c.id for c in cands}
        assert all(m.fidelity == Fidelity.FULL and m.attempt_no == 1 for m in measured.values())  # never a finalist

        cp1, cp2, cp4 = (led.evidence.parity(by_cp[cp].id) for cp in (1, 2, 4))
        assert cp1[0].passed and cp1[0].steps == 0 and "reference layout itself" in cp1[0].detail
        assert cp1[0].reference_key == "" and cp1[0].detail.startswith("not compared")  # never against itself
        # what the sweep prints and logs of a layout that is its own reference: "not compared", never "passed"
        said = [ln for ln in log.splitlines() if f"parity {by_cp[1].layout.short()}:" in ln]
        assert said and all("not compared" in ln and "passed" not in ln for ln in said), said
        (event,) = [e.message for e in led.events(SWEEP, kind="parity", candidate_id=by_cp[1].id)]
        assert event.startswith("parity: not compared") and "passed" not in event, event
        assert any(f"parity {by_cp[2].layout.short()}: passed against reference" in ln for ln in log.splitlines())
        for c, rows in ((by_cp[1], cp1), (by_cp[2], cp2), (by_cp[4], cp4)):
            assert all(r.reference_key != c.key for r in rows), (c.layout, rows)
        assert cp2[0].passed and cp2[0].steps == cfg.parity.steps and cp2[0].max_loss_diff < cfg.parity.loss_rtol
        assert cp2[0].reference_key == by_cp[1].key  # CP2's reference is the CP1 layout
        assert not cp4[0].passed and cp4[0].max_loss_diff > cfg.parity.loss_rtol and "step" in cp4[0].detail
        assert len(cp1) == len(cp2) == len(cp4) == 1
        assert after[by_cp[4].id].status == "excluded" and "parity failed" in after[by_cp[4].id].reason
        assert after[by_cp[1].id].status == after[by_cp[2].id].status == "done"
        # best never returns the excluded candidate: it is the fastest of those that passed
        best = queries.best(led, sweep=SWEEP)
        passing = [(measured[c.id].metrics["step_p50_s"], c.key) for c in cands if c.layout.cp != 4]
        assert best["key"] == min(passing)[1] != by_cp[4].key

        roles = {c.layout.cp: [a.role for a in led.attempts(c.id, roles=None)] for c in cands}
        # CP1 is its own reference; CP2 runs the shared CP1 reference (first in pick order), CP4 reuses it
        finalists_of = {cp: sorted(r[1:]) for cp, r in roles.items()}
        assert all(r[0] == AttemptRole.MEASURE for r in roles.values())
        assert finalists_of[1] == ["long-run-restore", "long-run-save"]
        (picked,) = [e.data["keys"] for e in led.events(SWEEP, kind="finalists")]
        assert sorted(picked) == sorted(c.key for c in cands)
        owner = min((2, 4), key=lambda cp: picked.index(by_cp[cp].key))  # the first of those sharing the CP1 reference
        other = 6 - owner
        assert finalists_of[owner] == sorted(
            ["parity", "parity-reference"] + (["long-run-save", "long-run-restore"] if owner == 2 else [])
        )
        assert finalists_of[other] == sorted(["parity"] + (["long-run-save", "long-run-restore"] if other == 2 else []))
        for c in cands:
            for a in led.attempts(c.id, roles=AttemptRole.FINALIST):
                assert a.job_id and a.launch_token and a.terminal  # an intent first, its id recorded
                spec = JobSpec.load(Path(a.job_dir) / "job.json")
                assert spec.role == a.role and spec.stage.warmup_iters == cfg.stage.warmup_iters  # stage untouched
                if a.role in (AttemptRole.PARITY, AttemptRole.PARITY_REFERENCE):
                    assert spec.window == (0, cfg.parity.steps)

        for cp in (1, 2):
            (ev,) = led.events(SWEEP, kind="long-run", candidate_id=by_cp[cp].id)
            info = ev.data
            assert info["ok"] and "Q_effective" in ev.message, info
            stored = led.evidence.result(info["attempt_id"])
            assert info["attempt_id"] == measured[by_cp[cp].id].attempt_id  # on the measurement, not a finalist
            for k in ("ckpt_save_s", "ckpt_restore_s", "tokens_per_s_after_restart", "effective_fraction"):
                assert stored[k] == pytest.approx(info[k]) and stored[k] > 0, k
            assert stored["q_effective"] < stored["tokens_per_s"] and stored["effective_fraction"] < 1
            assert stored["ckpt_save_s"] == pytest.approx(led.evidence.result(info["save_attempt_id"])["ckpt_save_s"])
        assert not led.events(SWEEP, kind="long-run", candidate_id=by_cp[4].id)  # excluded: no window
        # every finalist job is charged once, as an attempt (no finalist-cost event any more)
        assert not led.events(SWEEP, kind="finalist-cost")
        spent = history.spent(led, SWEEP, stage=cfg.stage)
        n_fin = sum(len(led.attempts(c.id, roles=AttemptRole.FINALIST)) for c in cands)
        assert n_fin == 7 and spent.attempts == 3 + n_fin and spent.by_fidelity["finalists"] > 0
        assert "parity" in log and "long-run" in log

    proc = cli(
        "compare",
        "--sweep",
        SWEEP,
        "--sort",
        "q_effective",
        "--format",
        "json",
        "--columns",
        "key,cp,status,q_effective,ckpt_save_s,ckpt_restore_s,attempt_no",
        f"ledger.url={cfg.ledger.url}",
    )
    assert proc.returncode == 0, proc.stderr
    table = json.loads(proc.stdout)
    q = [r["q_effective"] for r in table]
    assert q == sorted(q, reverse=True) and len(table) == 3  # best first
    assert {r["attempt_no"] for r in table} == {1}  # the candidate's latest attempt is its measurement
    row = next(r for r in table if r["key"] == by_cp[2].key)
    assert row["ckpt_save_s"] > 0


@pytest.mark.long
def test_parity_with_no_reference_that_fits_is_not_compared_without_running(tmp_path):
    """No layout of the stage has the reference knobs (EP7 exists nowhere): the finalist is recorded as not
    compared, never "passed", and stays a finalist (the gate is on at every stage, and at 1k no CP1 layout fits
    141 GB: excluding here would leave 1k without a winner). `best` and the report say "not checked"."""
    cfg = _cfg(tmp_path)
    cfg = dataclasses.replace(cfg, parity=dataclasses.replace(cfg.parity, enabled=True, reference={"ep": 7}))
    with Ledger.open(cfg.ledger.url) as led:
        (c,), after, log = _drive(cfg, led, LAYOUTS[1:2])
        (row,) = led.evidence.parity(c.id)
        assert row.passed and row.reference_key == "" and row.steps == 0
        assert row.detail.startswith("not compared: no reference to compare with") and "ep=7" in row.detail
        assert after[c.id].status == "done"
        assert led.attempts(c.id, roles=None) == led.attempts(c.id)  # nothing ran for the gate
        assert f"parity {c.layout.short()}: not compared" in log and "passed" not in log


@pytest.mark.long
def test_a_reference_at_8k_is_a_cp1_layout_the_model_allows():
    """At 8k the plain override (CP8 -> CP1) breaks the stage's rules or memory for every layout round 0 would
    measure; the reference is then the closest CP1 layout that fits, with the finalist's numerics."""
    cfg = compose(["+stage=8k"]).cfg
    res = planner.plan(cfg.model, cfg.hardware, cfg.stage, workload=cfg.workload.name, recipe=cfg.workload.recipe)
    lay = res.candidates[0].layout
    assert lay.cp > 1 and not finalists._planned(cfg, finalists.reference_layout(cfg, lay))[0]  # the override fails
    ref, why = finalists.reference(cfg, lay, lambda: finalists.stage_layouts(cfg))
    assert ref is not None, why
    assert ref.layout.cp == 1 and ref.prediction.feasible and ref.prediction.memory_gb <= cfg.hardware.hbm_gb
    assert isinstance(planner.evaluate(cfg.model, cfg.hardware, cfg.stage, ref.layout), planner.Planned)
    assert (ref.layout.optim, ref.layout.capacity_factor) == (lay.optim, lay.capacity_factor)


def test_update_result_metrics(ledger_url):
    with Ledger.open(ledger_url) as led:
        led.create_or_get_sweep(
            "u", stage="smoke", config_yaml="", model="tiny", hardware="h200", workload="twin", provenance={}
        )
        (c,) = led.add_candidates("u", [CandidateIn(key="k1", layout=Layout(ep=8).to_dict())])
        ok = led.new_attempt(c.id, job_dir="/tmp/a1", simulated=True)
        led.evidence.record_result(ok.id, {"ok": True, "simulated": True, "step_p50_s": 1.5, "tokens_per_s": 1000.0})
        after = led.evidence.update_result_metrics(ok.id, ckpt_save_s=2.5, q_effective=900.0, effective_fraction=0.9)
        assert after["ckpt_save_s"] == 2.5 and after["q_effective"] == 900.0 and after["tokens_per_s"] == 1000.0
        assert led.evidence.result(ok.id)["effective_fraction"] == 0.9
        with pytest.raises(LedgerError, match="not updatable"):
            led.evidence.update_result_metrics(ok.id, nonsense=1.0)
        with pytest.raises(LedgerError, match="not updatable"):
            led.evidence.update_result_metrics(ok.id, timers_ms={})
        failed = led.new_attempt(c.id, job_dir="/tmp/a2", simulated=True)
        with pytest.raises(LedgerError, match="no stored result"):
            led.evidence.update_result_metrics(failed.id, q_effective=1.0)


@pytest.mark.long
def test_a_resumed_driver_runs_no_finalist_job_again(tmp_path):
    """A second driver over the same sweep (resume after it ended) launches nothing: each verdict is in the
    ledger and the pick is the recorded one, so the excluded candidate pulls in no other."""
    cfg = _long(_cfg(tmp_path), promote_top_k=2)
    with Ledger.open(cfg.ledger.url) as led:
        cands, _, _ = _drive(cfg, led, LAYOUTS)
        before = {c.id: len(led.attempts(c.id, roles=None)) for c in cands}
        picked = [e.data["keys"] for e in led.events(SWEEP, kind="finalists")]
        outcome = Driver(led, cfg, led.get_sweep(SWEEP), make_launcher(cfg.cluster)[0], View(live=False)).run()
        assert outcome.reason == "max_rounds 1 reached"
        assert {c.id: len(led.attempts(c.id, roles=None)) for c in cands} == before
        assert [e.data["keys"] for e in led.events(SWEEP, kind="finalists")] == picked and len(picked[0]) == 2
        assert sum(len(led.evidence.parity(c.id)) for c in cands) == 2


def test_a_screened_only_candidate_or_a_probe_is_never_a_finalist(ledger_url):
    """Finalists are picked by the one ranking (orchestrator.core.ranking): a screen's p50 ranks contenders and
    a fit probe's few iterations answer "does it fit?"; neither is a full-window measurement, whatever its p50."""
    with Ledger.open(ledger_url) as led:
        led.create_or_get_sweep(
            "pick", stage="slice", config_yaml="", model="m", hardware="h", workload="twin", provenance={}
        )
        items = [CandidateIn(key=f"k{i}", layout=Layout(cp=cp, ep=32).to_dict()) for i, cp in enumerate((1, 2, 4))]
        full, screened, probed = led.add_candidates("pick", items)
        runs = ((full, Fidelity.FULL, 3.0), (screened, Fidelity.SCREEN, 2.0), (probed, Fidelity.PROBE, 1.0))
        for c, fid, p50 in runs:
            a = led.new_attempt(c.id, job_dir=f"/r/{c.key}", simulated=True, fidelity=fid)
            led.evidence.record_result(a.id, {"ok": True, "simulated": True, "step_p50_s": p50, "measure_iters": 5})
            led.set_candidate_status(c.id, "done", "measured")
        assert [c.key for c in finalists.pick(led, "pick", 3)] == [full.key]


def test_a_finalists_job_is_retried_by_the_one_retry_decision_then_judged(ledger_url, tmp_path):
    """A parity job lost to NODE_FAIL is asked for again (a new attempt, in a new folder), its reference is not;
    a deterministic failure (OOM) ends it: a failing verdict, the candidate excluded. On both engines."""
    from orchestrator.sweep.retry import retry_decision

    cfg = _cfg(tmp_path)
    cfg = dataclasses.replace(
        cfg,
        parity=dataclasses.replace(cfg.parity, enabled=True),
        policy=dataclasses.replace(cfg.policy, search=dataclasses.replace(cfg.policy.search, promote_top_k=1)),
    )
    pol = cfg.policy

    def retry(fc, atts):
        history = [a.failure_class or a.state for a in atts]
        return retry_decision(fc, history, max_attempts=pol.driver.max_attempts, retry_classes=pol.driver.retry_classes)

    with Ledger.open(ledger_url) as led:
        (c,), _ = _sweep(led, cfg, LAYOUTS[1:2])  # CP2: its reference (CP1) is a job
        m = led.new_attempt(c.id, job_dir=str(tmp_path / "m"), simulated=True)
        led.evidence.record_result(m.id, {"ok": True, "simulated": True, "step_p50_s": 1.0, "measure_iters": 5})
        fin = finalists.Finalists(cfg, led, SWEEP, retry)

        def launch(step):  # what the driver's launch path writes, then the job's outcome
            return [
                led.new_attempt(
                    x.candidate_id, job_id=f"j{i}", job_dir=x.spec.job_dir, simulated=True, role=x.spec.role
                )
                for i, x in enumerate(step.launches)
            ]

        first = launch(fin.step())
        assert sorted(a.role for a in first) == [AttemptRole.PARITY, AttemptRole.PARITY_REFERENCE]
        mine = next(a for a in first if a.role == AttemptRole.PARITY)
        ref = next(a for a in first if a.role == AttemptRole.PARITY_REFERENCE)
        curve = {"lm_loss": [2.0] * cfg.parity.steps, "grad_norm": [1.0] * cfg.parity.steps}
        led.evidence.record_result(
            ref.id, {"ok": True, "simulated": True, "step_p50_s": 1.0, "measure_iters": 20, **curve}
        )
        led.evidence.record_result(mine.id, {"ok": False, "failure_class": "NODE_FAIL", "slurm_state": "NODE_FAIL"})
        assert not led.evidence.parity(c.id)
        second = fin.step()
        (again,) = second.launches  # the candidate's run again, not the reference's
        assert again.spec.role == AttemptRole.PARITY and again.spec.job_dir != mine.job_dir
        (retried,) = launch(second)
        led.evidence.record_result(retried.id, {"ok": False, "failure_class": "OOM", "slurm_state": "FAILED"})
        third = fin.step()
        assert third.launches == [] and third.notes
        (row,) = led.evidence.parity(c.id)
        assert not row.passed and row.detail.startswith("candidate run failed: OOM")
        assert led.candidates(SWEEP)[0].status == "excluded"
        assert fin.step().launches == [] and len(led.evidence.parity(c.id)) == 1  # decided once
