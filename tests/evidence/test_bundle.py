"""The evidence bundle of a winner (orchestrator.evidence.bundle): what `best` and the report's decision give
beside the flags. The job's own evidence beats the sweep's provenance; the twin's is marked simulated; the
ledger keeps the versions and the NCCL/NVTE environment of each result (revision 0008)."""

from __future__ import annotations

import random

import pytest

from orchestrator.core.megatron import TESTED_COMMIT
from orchestrator.evidence import bundle
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger
from orchestrator.ledger.rows import CandidateIn
from orchestrator.plan.layout import Layout, canonical_key
from orchestrator.report.data import gather
from orchestrator.report.decision import decide
from orchestrator.report.html import render
from tests.report.test_report import _result, _sweep

OTHER = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "cd" * 32


def hit(versions=None, env=None, simulated=False, nodes="gpu[001-128]"):
    return {
        "simulated": simulated,
        "attempt": {"node_list": nodes},
        "metrics": {"versions": versions or {}, "run_env": env or {}},
    }


def test_the_jobs_evidence_beats_the_provenance_and_every_field_is_shown():
    versions = {
        "megatron_commit": TESTED_COMMIT,
        "transformer_engine": "2.13.0",
        "deep_ep": "1.2.1",
        "nccl": "2.27.3",
        "container_image": f"nvcr.io/nvidia/pytorch@{DIGEST}",
        "container_digest": DIGEST,
    }
    prov = {"megatron": {"commit": OTHER}, "container": {"image": "other", "digest": None}}
    parity = [{"passed": True, "reference_key": "ab" * 16, "steps": 20, "detail": "20 steps within loss rtol 2e-03"}]
    b = bundle.of_best(
        hit(versions, {"NCCL_IB_TIMEOUT": "19", "NVTE_CPU_OFFLOAD_V1": "1"}), parity=parity, provenance=prov
    )
    rows = dict(b.rows())
    assert rows["Megatron commit"].startswith(TESTED_COMMIT) and "the tested commit" in rows["Megatron commit"]
    assert "[from the job]" in rows["Megatron commit"] and b.notes  # preflight's node had another commit
    assert rows["container"] == f"nvcr.io/nvidia/pytorch@{DIGEST} @ {DIGEST}"
    assert (rows["Transformer Engine"], rows["DeepEP"], rows["NCCL"]) == ("2.13.0", "1.2.1", "2.27.3")
    assert rows["nodes"] == "gpu[001-128]" and rows["NCCL/NVTE env"] == "NCCL_IB_TIMEOUT=19 NVTE_CPU_OFFLOAD_V1=1"
    assert rows["parity"].startswith("passed vs reference abababab") and "20 steps" in rows["parity"]
    assert list(rows) == [
        "Megatron commit",
        "container",
        "Transformer Engine",
        "DeepEP",
        "NCCL",
        "nodes",
        "NCCL/NVTE env",
        "parity",
    ]


def test_provenance_fills_in_and_an_unknown_commit_is_said_so():
    b = bundle.of_best(hit(), provenance={"megatron": {"commit": OTHER}, "container": {"image": "img:tag"}})
    rows = dict(b.rows())
    assert OTHER in rows["Megatron commit"] and "not the tested" in rows["Megatron commit"]
    assert "[from the preflight]" in rows["Megatron commit"] and rows["container"] == "img:tag (no digest: unpinned)"
    none = dict(bundle.of_best(hit(), provenance={"megatron": "simulated (twin)"}, parity_enabled=False).rows())
    assert none["Megatron commit"] == "unrecorded" and none["container"] == "none (no container)"
    assert none["parity"].startswith("not run (parity.enabled=false)")


def test_the_twins_bundle_is_marked_simulated():
    sim = {k: "simulated" for k in ("megatron_commit", "transformer_engine", "deep_ep", "nccl")}
    rows = dict(bundle.of_best(hit(sim, simulated=True)).rows())
    for name in ("Megatron commit", "Transformer Engine", "DeepEP", "NCCL"):
        assert rows[name].startswith("simulated") and "the twin runs no Megatron" in rows[name], rows[name]


@pytest.mark.long
def test_the_ledger_keeps_the_bundle_and_the_report_shows_it(ledger_url, tmp_path):
    """Stored with the result (versions JSON, run_env revision 0008) on SQLite and PostgreSQL, read back by
    `best`, shown in the report's decision card."""
    with Ledger.open(ledger_url, create=True) as ledger:
        _sweep(ledger, "s", "smoke", 32)
        lay = Layout(pp=2, ep=8)
        (c,) = ledger.add_candidates(
            "s",
            [
                CandidateIn(
                    key=canonical_key(lay, model="tiny", stage="smoke", hardware="h100", workload="twin"),
                    layout=lay.to_dict(),
                    layer_pattern="CEHE|CEHE",
                    round=0,
                    predicted={"step_time_s": 1.0, "memory_gb": 20, "feasible": True},
                )
            ],
        )
        a = ledger.new_attempt(c.id, job_id="77", job_dir=str(tmp_path / "j"), simulated=False)
        ledger.update_attempt(a.id, state="COMPLETED", exit_code=0, node_list="n[1-4]")
        result = _result(1.0, random.Random(1), peak=20)
        result.update(
            simulated=False,
            versions={"megatron_commit": TESTED_COMMIT, "transformer_engine": "2.13.0", "nccl": "2.27.3"},
            run_env={"NCCL_IB_TIMEOUT": "19"},
        )
        ledger.evidence.record_result(a.id, result)
        ledger.set_candidate_status(c.id, "done")
        got = queries.best(ledger, sweep="s")
        assert got["metrics"]["run_env"] == {"NCCL_IB_TIMEOUT": "19"}
        assert got["metrics"]["versions"]["megatron_commit"] == TESTED_COMMIT
        d = gather(ledger, "s")
        dec = decide(ledger, d)
        page = render(d, tmp_path / "out", dec).read_text()
    assert dec.bundle is not None and dict(dec.bundle.rows())["nodes"] == "n[1-4]"
    assert "id='bundle'" in page and TESTED_COMMIT in page and "NCCL_IB_TIMEOUT=19" in page
