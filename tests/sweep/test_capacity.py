"""An OOM message's capacity replaces hardware.hbm_gb for the rest of the sweep: in the planner's feasibility,
in the observations the search (calibration, fit probes) sees, read from the ledger on every decision (so a
resumed driver plans the same), said once with the config to fix. Evidence that agrees with the config (the
message's rounding) changes nothing."""

from __future__ import annotations

import pytest

from orchestrator import history
from orchestrator.config import compose
from orchestrator.core.result import JobResult
from orchestrator.core.states import EventKind
from orchestrator.evidence.metrics import CAPACITY_FROM_DEVICE, CAPACITY_FROM_OOM
from orchestrator.ledger.ledger import CandidateIn, Ledger
from orchestrator.search.env import PlanEnv
from orchestrator.sweep import capacity
from tests.sweeplib import new_sweep

GIB96_GB = 96 * 2**30 / 1e9  # what "GPU 0 has a total capacity of 96.00 GiB" holds, in hbm_gb's decimal GB


class Events:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, line: str) -> None:
        self.lines.append(line)


def _sweep(led: Ledger, name: str, *states: tuple[bool, float | None, str]):
    """A 1k sweep (hardware=h200: hbm_gb 141) whose first candidates ran: (ok, stated GB, source) each."""
    composed = compose(["+stage=1k"])
    cfg = composed.cfg
    sweep = new_sweep(led, name, composed)
    env = PlanEnv(cfg.model, cfg.hardware, cfg.required_stage(), cfg.workload.name)
    planned = env.plan()[: len(states)]
    rows = led.add_candidates(
        name,
        [
            CandidateIn(key=p.key, layout=p.layout.to_dict(), predicted=env.proposal(p, reason="t").predicted)
            for p in planned
        ],
    )
    for i, (row, (ok, gb, source)) in enumerate(zip(rows, states)):
        a = led.new_attempt(row.id, job_id=f"{100 + i}", job_dir="(test)", simulated=True)
        res = JobResult(ok=ok, simulated=True, gpu_capacity_gb=gb, gpu_capacity_source=source)
        if ok:
            res.step_p50_s, res.measure_iters, res.peak_reserved_gb = 50.0, 10, 90.0
        else:
            res.failure_class, res.exit_code = "OOM", 1
        led.evidence.record_result(a.id, res.to_dict())
        led.set_candidate_status(row.id, "done" if ok else "failed", "test")
    return cfg, sweep, env


def test_an_ooms_capacity_replaces_hbm_in_every_memory_decision(ledger_url):
    with Ledger.open(ledger_url, create=True) as led:
        cfg, sweep, env = _sweep(led, "small", (True, None, ""), (False, GIB96_GB, CAPACITY_FROM_OOM))
        assert env.hardware.hbm_gb == 141.0
        view = Events()
        eff = capacity.plan_env(led, "small", env, view)
        assert eff.hardware.hbm_gb == GIB96_GB  # exact: 96 x 2**30 / 1e9, not 96
        assert view.lines == [
            "warning: GPUs hold 103.1 GB (96.00 GiB, job 101's OOM message), not hardware.hbm_gb=141: "
            "planning with 103.1 GB from now; set hardware.hbm_gb=103.1 or pick the right hardware group"
        ]
        (ev,) = led.events("small", kind=EventKind.CAPACITY)
        assert ev.data["gb"] == GIB96_GB and ev.data["job_id"] == "101"
        # the observations the search calibrates on carry the measured capacity, not the config's
        obs = history.observations(led, [sweep], eff)
        assert obs and {o.hbm_gb for o in obs} == {GIB96_GB}
        assert {o.hbm_gb for o in history.observations(led, [sweep], env)} == {141.0}
        # the planner keeps only layouts that fit the GPUs the jobs ran on
        margin = cfg.required_stage().memory_margin_gb
        assert all(c.prediction.memory_gb + margin <= GIB96_GB for c in eff.plan())
        assert any(c.prediction.memory_gb + margin > GIB96_GB for c in env.plan())
        assert eff.fits(GIB96_GB - margin) and not eff.fits(GIB96_GB - margin + 0.1) and env.fits(120.0)
    # another process (a resumed driver) plans the same from the ledger, and says nothing twice
    with Ledger.open(ledger_url) as led:
        again = Events()
        assert capacity.plan_env(led, "small", env, again).hardware.hbm_gb == GIB96_GB
        assert again.lines == [] and len(led.events("small", kind=EventKind.CAPACITY)) == 1
        assert history.effective_config(led, cfg, "small").hardware.hbm_gb == GIB96_GB
        shown = history.capacity_view(led, "small", cfg.hardware)
        assert shown["gib"] == pytest.approx(96.0) and shown["overrides"] and "hardware.hbm_gb=141" in shown["line"]


def test_the_smallest_statement_wins_and_names_its_job(ledger_url):
    with Ledger.open(ledger_url, create=True) as led:
        _cfg, _sweep_row, env = _sweep(
            led, "mixed", (True, 150.11, CAPACITY_FROM_DEVICE), (False, GIB96_GB, CAPACITY_FROM_OOM)
        )
        assert [r.gb for r in led.evidence.gpu_capacities("mixed")] == [150.11, GIB96_GB]
        cap = history.measured(led, "mixed", env.hardware)
        assert (cap.gb, cap.job_id, cap.source) == (GIB96_GB, "101", CAPACITY_FROM_OOM)


@pytest.mark.long
def test_a_larger_gpu_is_evidence_too(ledger_url):
    """A real H200 reports 150.11 GB (139.8 GiB) where h200.yaml says 141: the sweep plans with what it has."""
    with Ledger.open(ledger_url, create=True) as led:
        _cfg, _s, env = _sweep(led, "big", (True, 150.11, CAPACITY_FROM_DEVICE))
        view = Events()
        assert capacity.plan_env(led, "big", env, view).hardware.hbm_gb == 150.11
        assert "job 100's device properties" in view.lines[0] and "hardware.hbm_gb=150.1" in view.lines[0]


def test_evidence_that_agrees_with_the_config_changes_nothing(ledger_url):
    """The twin's default GPU is its hardware group's: 141 GB is "131.32 GiB" in its message (0.004 GB off)."""
    stated = round(141e9 / 2**30, 2) * 2**30 / 1e9
    with Ledger.open(ledger_url, create=True) as led:
        _cfg, _s, env = _sweep(led, "same", (False, stated, CAPACITY_FROM_OOM), (True, 141.0, CAPACITY_FROM_DEVICE))
        view = Events()
        assert capacity.plan_env(led, "same", env, view) is env
        assert view.lines == [] and not led.events("same", kind=EventKind.CAPACITY)
        assert history.capacity_view(led, "same", env.hardware)["line"] == ""


def test_nothing_stated_keeps_the_config(ledger_url):
    with Ledger.open(ledger_url, create=True) as led:
        _cfg, _s, env = _sweep(led, "none", (True, None, ""), (False, None, ""))
        assert capacity.plan_env(led, "none", env, Events()) is env
        assert (
            history.measured(led, "none", env.hardware) is None
            and history.capacity_view(led, "none", env.hardware) is None
        )


def test_oom_launches_do_not_use_up_max_runs(ledger_url):
    """On a GPU smaller than its hardware group, OOMs must not spend the sweep's runs: each OOM costs its
    GPU-hours (start-up and an iteration) but not a run; a measured candidate does."""
    with Ledger.open(ledger_url, create=True) as led:
        cfg, _, _ = _sweep(
            led, "ooms", (True, None, ""), (False, GIB96_GB, CAPACITY_FROM_OOM), (False, GIB96_GB, CAPACITY_FROM_OOM)
        )
        spent = history.spent(led, "ooms", stage=cfg.required_stage())
        assert (spent.runs, spent.attempts) == (1, 3)
        # a probe is no run either
        (cand,) = led.add_candidates(
            "ooms", [CandidateIn(key="probe-only", layout=led.candidates("ooms")[0].layout, predicted={})]
        )
        a = led.new_attempt(cand.id, job_id="200", job_dir="(test)", simulated=True, fidelity="probe")
        led.evidence.record_result(a.id, JobResult(ok=True, simulated=True, peak_reserved_gb=90.0).to_dict())
        again = history.spent(led, "ooms", stage=cfg.required_stage())
        assert (again.runs, again.attempts) == (1, 4)
