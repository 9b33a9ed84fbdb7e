"""A rank probe's figures depend on the torch, the Megatron and the probe mode it ran with (orchestrator/plan/probe.py
`provenance`): the search reads a probe only beside probes of the newest provenance, and `status` says how many
probes count and how many ran on other versions. On SQLite and PostgreSQL."""

from __future__ import annotations

from orchestrator import history
from orchestrator.config import compose
from orchestrator.core.result import JobResult
from orchestrator.core.states import Fidelity
from orchestrator.ledger.ledger import CandidateIn, Ledger
from orchestrator.plan import probe
from orchestrator.search.env import PlanEnv
from tests.sweeplib import new_sweep

OLD = {"torch": "2.11.0", "megatron_commit": "d48bd6be0a85", "probe_mode": probe.MODE}
NEW = {"torch": "2.13.0", "megatron_commit": "d48bd6be0a85", "probe_mode": probe.MODE}


def _probed(led: Ledger, name: str, versions: list[dict]):
    composed = compose(["+stage=1k"])
    cfg = composed.cfg
    new_sweep(led, name, composed)
    env = PlanEnv(cfg.model, cfg.hardware, cfg.required_stage(), cfg.workload.name)
    planned = env.plan()[: len(versions)]
    rows = led.add_candidates(
        name,
        [
            CandidateIn(key=p.key, layout=p.layout.to_dict(), predicted=env.proposal(p, reason="t").predicted)
            for p in planned
        ],
    )
    for i, (row, v) in enumerate(zip(rows, versions)):
        a = led.new_attempt(row.id, job_id=f"{200 + i}", job_dir="(test)", simulated=True, fidelity=Fidelity.PROBE)
        res = JobResult(ok=True, simulated=True, versions=dict(v))
        res.step_p50_s, res.measure_iters, res.peak_reserved_gb = 30.0, 5, 80.0
        led.evidence.record_result(a.id, res.to_dict())
        led.set_candidate_status(row.id, "done", "test")
    return env, rows


def test_a_probe_of_other_versions_is_no_evidence_and_status_says_so(ledger_url):
    with Ledger.open(ledger_url, create=True) as led:
        env, rows = _probed(led, "pv", [OLD, OLD, NEW])  # the stack changed before the third probe
        sweep = led.get_sweep("pv")
        seen = {o.key for o in history.observations(led, [sweep], env)}
        assert seen == {rows[2].key}  # only the newest provenance's probe is read
        prov = history.provenance_of(led, [sweep])
        assert prov.current == probe.provenance(NEW) and prov.stale == {rows[0].id, rows[1].id}
        assert prov.line() == (
            f"probes: 1 on {probe.provenance_text(probe.provenance(NEW))}; 2 on other versions, not evidence here"
        )


def test_probes_of_one_provenance_are_all_evidence(ledger_url):
    with Ledger.open(ledger_url, create=True) as led:
        env, rows = _probed(led, "pv1", [NEW, NEW])
        sweep = led.get_sweep("pv1")
        assert {o.key for o in history.observations(led, [sweep], env)} == {r.key for r in rows}
        assert history.provenance_of(led, [sweep]).line().startswith("probes: 2 on torch 2.13.0")
