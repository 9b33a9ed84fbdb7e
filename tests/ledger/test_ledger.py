"""Ledger API against SQLite and the real PostgreSQL (fixture `ledger_url` runs each test on both)."""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import asdict

import pytest
from sqlalchemy import text

from orchestrator.core.result import JobResult, RankMemory
from orchestrator.core.states import AttemptState, EdgeKind, Fidelity
from orchestrator.launch.base import state_of
from orchestrator.ledger.errors import LeaseHeld, LedgerError
from orchestrator.ledger.ledger import CandidateIn, Ledger
from orchestrator.plan.layout import Layout, Prediction, canonical_key


def make_items(n: int, *, round: int = 0, stage: str = "1k") -> list[CandidateIn]:
    out = []
    for i in range(n):
        lay = Layout(
            tp=1,
            pp=8,
            vpp=1 + i % 2,
            cp=1,
            ep=(32, 64, 128)[i % 3],
            mbs=1 + i,
            recompute=("moe_act",) if i % 4 == 0 else (),
            dispatcher="flex" if i % 2 else "alltoall",
            flex_backend="deepep" if i % 2 else None,
        )
        pred = Prediction(
            d_a=128,
            d_e=2,
            m=32,
            bubble=0.1,
            t_group=4096,
            t_expert=64.0,
            experts_per_rank=6,
            ep_nodes=8,
            cp_nodes=1,
            routed_weight_gb=40.0,
            heaviest_stage=0,
            memory_gb=60.0 + i,
            memory_by_stage=(60.0 + i, 55.0),
            feasible=True,
            step_time_s=10.0 + i,
            mfu=0.3,
            tokens_per_s=1e6,
            layer_pattern="E" * 8,
        )
        key = canonical_key(lay, model="dsv4_pro", stage=stage, hardware="h100", workload="twin")
        out.append(
            CandidateIn(
                key=key, layout=lay.to_dict(), layer_pattern=pred.layer_pattern, predicted=asdict(pred), round=round
            )
        )
    return out


def job_result(step_s: float, *, n: int = 5, partial: bool = False, ok: bool = True, **kw) -> dict:
    times = [step_s * (1 + 0.01 * i) for i in range(n)]
    return JobResult(
        ok=ok,
        simulated=True,
        warmup_iters=2,
        measure_iters_requested=n,
        measure_iters=n,
        partial=partial,
        step_times_s=times,
        step_p50_s=step_s,
        step_p95_s=step_s * 1.04,
        step_p99_s=kw.pop("p99", step_s * 1.05),
        tokens_per_s_per_gpu=4096 * 8192 / step_s / 1024,
        mfu=0.31,
        peak_allocated_gb=70.0,
        peak_reserved_gb=kw.pop("reserved", 75.0),
        token_drop_fraction=0.0,
        rank_memory=[
            RankMemory(rank=r, pp_stage=r // 2, allocated_mb=1000.0 + r, reserved_mb=1200.0) for r in range(4)
        ],
        lm_loss=[2.0 - 0.01 * i for i in range(n)],
        grad_norm=[1.0] * n,
        ckpt_save_s=12.5,
        log_paths=["/runs/a/rank-0.out"],
        versions={"torch": "2.13"},
        **kw,
    ).to_dict()


@pytest.fixture
def ledger(ledger_url):
    led = Ledger.open(ledger_url)
    led.create_or_get_sweep(
        "s1",
        stage="1k",
        config_yaml="stage: 1k\n",
        model="dsv4_pro",
        hardware="h100",
        workload="twin",
        provenance={"project": "0.1.0", "torch": "2.13"},
    )
    yield led
    led.close()


def test_fresh_database_is_upgraded_and_sweep_is_idempotent(ledger):
    again = ledger.create_or_get_sweep(
        "s1", stage="1k", config_yaml="other", model="dsv4_pro", hardware="h100", workload="twin", provenance={}
    )
    assert again.id == ledger.get_sweep("s1").id
    assert again.provenance["project"] == "0.1.0" and again.created_at.tzinfo is not None
    with pytest.raises(LedgerError, match="already exists with stage=1k"):
        ledger.create_or_get_sweep(
            "s1", stage="8k", config_yaml="", model="dsv4_pro", hardware="h100", workload="twin", provenance={}
        )
    assert [s.name for s in ledger.list_sweeps()] == ["s1"]
    ledger.set_sweep_status("s1", "running")
    assert ledger.get_sweep("s1").status == "running"
    assert ledger.get_sweep("nope") is None
    with pytest.raises(LedgerError, match="no sweep named 'nope'"):
        ledger.candidates("nope")


def test_add_candidates_is_idempotent_and_keeps_knobs(ledger):
    items = make_items(6)
    rows = ledger.add_candidates("s1", items)
    assert [r.key for r in rows] == [i.key for i in items]
    again = ledger.add_candidates("s1", items + items[:2])
    assert [r.id for r in again] == [r.id for r in rows] + [rows[0].id, rows[1].id]
    assert len(ledger.candidates("s1")) == 6
    assert len(ledger.events("s1", kind="planned")) == 6  # planned once, not on the re-run
    assert rows[1].layout == items[1].layout
    assert rows[0].predicted["memory_by_stage"] == [60.0, 55.0]
    with ledger.engine.connect() as s:  # the raw columns, as SQL sees them
        knobs = s.execute(
            text("SELECT ep, recompute, dispatcher, backend, pred_step_time_s FROM candidate ORDER BY id")
        ).all()
    assert knobs[0] == (32, "moe_act", "alltoall", None, 10.0)
    assert knobs[1] == (64, "none", "flex", "deepep", 11.0)


def test_parent_edges_same_sweep_and_promotion_across_sweeps(ledger):
    parent = ledger.add_candidates("s1", make_items(1))[0]
    child = make_items(2)[1]
    child.parent_key, child.edge_kind, child.round = parent.key, EdgeKind.NEIGHBOUR, 1
    row = ledger.add_candidates("s1", [child])[0]
    assert (row.parent_id, row.edge_kind, row.round) == (parent.id, EdgeKind.NEIGHBOUR, 1)
    assert row.edge_kind == "neighbour"  # StrEnum: the stored text is the value, as before the enum
    ledger.create_or_get_sweep(
        "s8k", stage="8k", config_yaml="", model="dsv4_pro", hardware="h100", workload="twin", provenance={}
    )
    promoted = make_items(1, stage="8k")[0]
    promoted.parent_key, promoted.edge_kind = parent.key, EdgeKind.PROMOTED_FROM
    assert ledger.add_candidates("s8k", [promoted])[0].parent_id == parent.id
    odd = make_items(4)[3]
    odd.parent_key, odd.edge_kind = parent.key, "neighbour-of"  # the old docstring's word, never written
    with pytest.raises(LedgerError, match="edge kind 'neighbour-of' is not one of neighbour, joint, promoted-from"):
        ledger.add_candidates("s1", [odd])
    orphan = make_items(3)[2]
    orphan.parent_key = "f" * 32
    with pytest.raises(LedgerError, match="parent ffffffffff is not in the ledger"):
        ledger.add_candidates("s1", [orphan])
    assert ledger.candidate_by_key("s1", orphan.key) is None  # the whole batch rolled back


def test_claims_are_exclusive_and_ordered_by_round(ledger):
    ledger.add_candidates("s1", make_items(3, round=1))
    ledger.add_candidates("s1", make_items(5, round=0)[3:])  # two round-0 candidates, added later
    first = ledger.claim_for_submission("s1", 3, "orch-a")
    assert [c.round for c in first] == [0, 0, 1] and all(c.status == "claimed" for c in first)
    second = ledger.claim_for_submission("s1", 10, "orch-b")
    assert len(second) == 2 and not {c.id for c in first} & {c.id for c in second}
    assert ledger.claim_for_submission("s1", 10, "orch-c") == []
    assert {c.claimed_by for c in ledger.candidates("s1", status="claimed")} == {"orch-a", "orch-b"}


def test_attempt_numbers_updates_and_live_attempts(ledger):
    cand = ledger.add_candidates("s1", make_items(1))[0]
    a1 = ledger.new_attempt(cand.id, job_dir="/runs/s1/k/attempt-1", simulated=True)
    a2 = ledger.new_attempt(cand.id, job_id="1234_0", array_index=0, job_dir="/runs/s1/k/attempt-2", simulated=True)
    assert (a1.attempt_no, a2.attempt_no) == (1, 2)
    assert ledger.candidate_by_key("s1", cand.key).latest_attempt_id == a2.id
    up = ledger.update_attempt(
        a1.id,
        state="FAILED",
        failure_class="NODE_FAIL",
        exit_code=1,
        node_list="n[1-4]",
        start_time="2026-01-01T10:00:00",
        end_time=1767261600.0,
        log_paths=["/x/rank-0.out"],
    )
    assert up.terminal and up.start_time.hour == 10 and up.end_time.tzinfo is not None
    assert [a.id for a in ledger.live_attempts("s1")] == [a2.id]
    with pytest.raises(ValueError, match="unknown fields"):
        ledger.update_attempt(a1.id, colour="red")
    with pytest.raises(LedgerError, match="attempt state 'LOST' is not one of PENDING"):
        ledger.update_attempt(a1.id, state="LOST")
    assert [a.attempt_no for a in ledger.attempts(cand.id)] == [1, 2]


def test_revoked_is_terminal_for_launch_and_ledger_alike(ledger):
    """One set of terminal states: a REVOKED job is finished for the launcher AND the ledger, so the loop
    never waits on it (the two copies had drifted: the ledger's lacked REVOKED)."""
    cand = ledger.add_candidates("s1", make_items(1))[0]
    att = ledger.new_attempt(cand.id, job_id="77", job_dir="/runs/x", simulated=True)
    assert not att.terminal and att.state is AttemptState.PENDING
    st = state_of("REVOKED")
    assert st.terminal
    row = ledger.update_attempt(att.id, state=st.state)
    assert row.terminal and row.state is AttemptState.REVOKED
    assert ledger.live_attempts("s1") == []  # not polled again
    for word in AttemptState:  # every word: launch and ledger agree
        assert state_of(word).terminal == (word in AttemptState.TERMINAL)
        assert ledger.update_attempt(att.id, state=word).terminal == state_of(word).terminal
        assert [a.id for a in ledger.live_attempts("s1")] == ([] if state_of(word).terminal else [att.id])


def test_record_result_stores_everything_once(ledger):
    cand = ledger.add_candidates("s1", make_items(1))[0]
    att = ledger.new_attempt(cand.id, job_dir="/runs/x", simulated=True)
    ledger.update_attempt(att.id, exit_code=0, state="COMPLETED")
    res = job_result(2.0)
    ledger.evidence.record_result(att.id, res)
    assert ledger.attempts(cand.id)[0].exit_code == 0  # a JobResult without an exit code keeps sacct's
    ledger.evidence.record_result(att.id, job_result(9.0))  # idempotent: the first result stays
    stored = ledger.evidence.result(att.id)
    assert stored["step_p50_s"] == 2.0 and stored["ckpt_save_s"] == 12.5 and stored["versions"] == {"torch": "2.13"}
    samples = ledger.evidence.step_samples(att.id)
    assert [s[1] for s in samples] == pytest.approx(res["step_times_s"])
    assert [s[2] for s in samples] == pytest.approx(res["lm_loss"])
    assert [r["rank"] for r in ledger.evidence.rank_memory(att.id)] == [0, 1, 2, 3]
    after = ledger.attempts(cand.id)[0]
    assert after.state == "COMPLETED" and after.log_paths == ["/runs/a/rank-0.out"]
    (row,) = ledger.evidence.measured(sweep="s1")
    assert row.key == cand.key and row.metrics["tokens_per_s_per_gpu"] == res["tokens_per_s_per_gpu"]
    assert row.predicted["step_time_s"] == 10.0 and row.simulated


def test_a_result_row_hands_out_its_metrics_typed_by_the_registry(ledger):
    """Issue 46 item 1: the metrics of a result row are core/metrics' `Measured`: every registry name, each of
    its metric's type (SQLite returns a count or a flag as it stored it), a name that is no metric a KeyError
    (a typo is never a silent None), the ranking figures as typed properties; equal to the stored columns."""
    from orchestrator.core.metrics import METRIC, Measured

    cand = ledger.add_candidates("s1", make_items(1))[0]
    att = ledger.new_attempt(cand.id, job_dir="/runs/x", simulated=True)
    ledger.evidence.record_result(att.id, job_result(2.0, settled_iters=7))
    (row,) = ledger.evidence.measured(sweep="s1")
    for got in (row.metrics, ledger.evidence.result(att.id)):
        assert isinstance(got, Measured) and set(got) == set(METRIC)
        assert got.step_p50_s == 2.0 and got.step_p99_s == got["step_p99_s"] and got.settled_iters == 7
        assert isinstance(got["measure_iters"], int) and isinstance(got["simulated"], bool)
        assert got.peak_gb == got["peak_reserved_gb"] and got.tokens_per_s == got["tokens_per_s"]
        with pytest.raises(KeyError, match="step_p50"):
            got["step_p50"]
    assert dict(ledger.evidence.update_result_metrics(att.id, ckpt_save_s=3.0)) == {
        **dict(row.metrics),
        "ckpt_save_s": 3.0,
    }
    with pytest.raises(KeyError, match="not metrics"):
        Measured({"step_p50": 1.0})


def test_a_finalist_attempt_is_never_the_candidates_measurement(ledger):
    """Every job is an attempt with a role; only a measure attempt is the candidate's latest attempt and result,
    what `measured` (the best, calibration, noise), `queries.best` and the default `attempts` read."""
    from orchestrator.core.states import AttemptRole
    from orchestrator.ledger import queries

    cand = ledger.add_candidates("s1", make_items(1))[0]
    meas = ledger.new_attempt(cand.id, job_dir="/runs/x/attempt-1", simulated=True)
    ledger.evidence.record_result(meas.id, job_result(2.0))
    fin = ledger.new_attempt(
        cand.id, job_dir="/runs/x/parity-2", simulated=True, role=AttemptRole.PARITY, launch_token="s1.fin"
    )
    assert (fin.attempt_no, fin.role, fin.measures) == (2, AttemptRole.PARITY, False)
    ledger.launched([(fin.id, "81", None)])
    ledger.evidence.record_result(fin.id, job_result(1.0))  # faster, and still never the measurement
    c = ledger.candidates("s1")[0]
    assert (c.latest_attempt_id, c.latest_result_id is not None, c.status) == (meas.id, True, "planned")
    (row,) = ledger.evidence.measured(sweep="s1")
    assert row.attempt_id == meas.id and row.metrics["step_p50_s"] == 2.0
    assert queries.best(ledger, sweep="s1")["attempt"]["id"] == meas.id
    assert [a.id for a in ledger.attempts(cand.id)] == [meas.id]
    assert [a.id for a in ledger.attempts(cand.id, roles=AttemptRole.FINALIST)] == [fin.id]
    assert [a.role for a in ledger.attempts(cand.id, roles=None)] == [AttemptRole.MEASURE, AttemptRole.PARITY]
    assert (
        ledger.evidence.result(fin.id)["step_p50_s"] == 1.0 and len(ledger.evidence.step_samples(fin.id)) == 5
    )  # its evidence
    assert any("parity job 81" in e.message for e in ledger.events("s1", kind="launched"))
    with pytest.raises(LedgerError, match="attempt role"):
        ledger.new_attempt(cand.id, job_dir="/runs/x/y", simulated=True, role="bogus")


def test_failed_result_updates_attempt_without_result_row(ledger):
    cand = ledger.add_candidates("s1", make_items(1))[0]
    att = ledger.new_attempt(cand.id, job_dir="/runs/x", simulated=True)
    bad = JobResult(
        ok=False,
        simulated=True,
        failure_class="OOM",
        failure_detail="CUDA out of memory",
        exit_code=1,
        rank_memory=[RankMemory(rank=0, pp_stage=0, allocated_mb=79000.0, reserved_mb=80000.0)],
    ).to_dict()
    ledger.evidence.record_result(att.id, bad)
    ledger.evidence.record_result(att.id, bad)
    assert ledger.evidence.result(att.id) is None and ledger.evidence.measured() == []
    a = ledger.attempts(cand.id)[0]
    assert (a.state, a.failure_class, a.failure_detail) == ("FAILED", "OOM", "CUDA out of memory")
    assert ledger.evidence.rank_memory(att.id)[0]["reserved_mb"] == 80000.0  # the OOM's peaks are evidence


def test_record_result_is_one_transaction(ledger):
    cand = ledger.add_candidates("s1", make_items(1))[0]
    att = ledger.new_attempt(cand.id, job_dir="/runs/x", simulated=True)
    res = job_result(2.0)
    res["rank_memory"].append(dict(res["rank_memory"][0]))  # duplicate rank: violates (attempt, rank)
    with pytest.raises(Exception):
        ledger.evidence.record_result(att.id, res)
    assert ledger.evidence.result(att.id) is None and ledger.evidence.step_samples(att.id) == []
    assert ledger.candidate_by_key("s1", cand.key).latest_result_id is None


def test_status_changes_are_audited(ledger):
    cand = ledger.add_candidates("s1", make_items(1))[0]
    ledger.set_candidate_status(cand.id, "submitted", "array 77")
    ledger.set_candidate_status(cand.id, "cancelled", "user asked")
    assert ledger.candidate_by_key("s1", cand.key).reason == "user asked"
    msgs = [e.message for e in ledger.events("s1", candidate_id=cand.id)]
    assert msgs[-2:] == ["planned -> submitted: array 77", "submitted -> cancelled: user asked"]
    with pytest.raises(LedgerError, match="not one of"):
        ledger.set_candidate_status(cand.id, "exploded")
    ledger.log_event("s1", "promoted", "top-3 to 8k", data={"keys": [cand.key], "gain": float("nan")})
    ev = ledger.events("s1", kind="promoted")[0]
    assert ev.data == {"keys": [cand.key], "gain": None}


def test_leases(ledger):
    ledger.leases.acquire_lease("s1", "orch-a", ttl_s=60)
    ledger.leases.acquire_lease("s1", "orch-a", ttl_s=60)  # renew
    with pytest.raises(LeaseHeld) as held:
        ledger.leases.acquire_lease("s1", "orch-b", ttl_s=60)
    assert held.value.holder == "orch-a" and held.value.user_facing
    ledger.leases.heartbeat("s1", "orch-a")
    ledger.leases.release_lease("s1", "orch-a")
    ledger.leases.acquire_lease("s1", "orch-b", ttl_s=0.05)
    time.sleep(0.1)
    ledger.leases.acquire_lease("s1", "orch-c", ttl_s=60)  # stale: taken over
    assert "stale lease of orch-b" in ledger.events("s1", kind="lease")[-1].message
    with pytest.raises(LeaseHeld):
        ledger.leases.heartbeat("s1", "orch-b")  # the old holder learns it lost the sweep


def test_calibration_and_parity_exclusion_data(ledger):
    cand = ledger.add_candidates("s1", make_items(1))[0]
    cal = ledger.evidence.record_calibration("s1", 1, {"truth_a2a": 1.3}, {"mape_step": 0.04})
    assert ledger.evidence.calibrations("s1") == [cal]
    p = ledger.evidence.record_parity(
        cand.id,
        reference_key="a" * 32,
        steps=20,
        max_loss_diff=0.2,
        max_grad_norm_diff=0.1,
        tolerance=0.01,
        passed=False,
        detail="loss diverges at step 7",
    )
    assert ledger.evidence.parity(cand.id) == [p] and not p.passed


def test_rows_hand_out_fidelity_members_and_whether_a_candidate_is_excluded(ledger):
    """Fidelity is converted once, at the ledger boundary: every row that holds one holds the enum member; a
    measured row says whether its candidate failed the correctness gate (what orchestrator.core.ranking reads)."""
    from orchestrator.ledger import queries
    from orchestrator.search.types import Observation, Proposal

    cands = ledger.add_candidates("s1", make_items(2))
    for c, fid in zip(cands, ("screen", "full"), strict=True):
        a = ledger.new_attempt(c.id, job_id=f"j{c.id}", job_dir="-", simulated=True, fidelity=fid)
        ledger.evidence.record_result(a.id, job_result(1.0))
    ledger.set_candidate_status(cands[1].id, "excluded", "parity failed")
    rows = [*ledger.attempts(cands[0].id), *ledger.evidence.measured(sweep="s1"), *queries.attempt_costs(ledger, "s1")]
    obs = Observation(key="k", layout=Layout(), raw_components={}, raw_step_s=1.0, raw_memory_gb=1.0, fidelity="probe")
    prop = Proposal(key="k", layout=Layout(), predicted={}, reason="round0", fidelity="screen")
    assert all(type(x.fidelity) is Fidelity for x in [*rows, obs, prop]), [type(x.fidelity) for x in rows]
    assert [(r.fidelity, r.excluded) for r in ledger.evidence.measured(sweep="s1")] == [
        (Fidelity.SCREEN, False),
        (Fidelity.FULL, True),
    ]
    assert queries.best(ledger, sweep="s1") is None  # a screen never decides, an excluded candidate never wins


def test_sqlite_pragmas_and_begin_immediate(tmp_path):
    url = f"sqlite:///{tmp_path / 'sub' / 'ledger.sqlite'}"  # the parent folder is created when asked
    with Ledger.open(url, create_dir=True) as led:
        with led.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        seen = []
        from sqlalchemy import event

        event.listen(led.engine, "before_cursor_execute", lambda c, cur, stmt, *a: seen.append(stmt))
        led.create_or_get_sweep("s", stage="1k", config_yaml="", model="m", hardware="h", workload="w", provenance={})
        led.get_sweep("s")
    assert "BEGIN IMMEDIATE" in seen and "BEGIN DEFERRED" in seen  # writes lock up front, reads do not


def test_unreachable_database_one_clear_error_with_masked_password():
    with pytest.raises(LedgerError) as err:
        Ledger.open("postgresql+psycopg://postgres:s3cret-pw@127.0.0.1:1/ledger")
    msg = str(err.value)
    assert "cannot reach the ledger" in msg and "s3cret-pw" not in msg and "postgres:***@127.0.0.1:1" in msg
    with pytest.raises(LedgerError, match="not supported"):
        Ledger.open("mysql://root@127.0.0.1/x")
    with pytest.raises(LedgerError, match="not a database URL"):
        Ledger.open("not a url")


def test_url_from_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_TEST_LEDGER", f"sqlite:///{tmp_path / 'env.sqlite'}")
    with Ledger.open("env:ORCH_TEST_LEDGER") as led:
        assert led.url.endswith("env.sqlite")
    with pytest.raises(LedgerError, match="ORCH_TEST_UNSET is not set"):
        Ledger.open("env:ORCH_TEST_UNSET")


def _imports(path) -> list[str]:
    import ast

    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
    return names


# stdlib-only vocabulary modules orchestrator/ledger/ may read (they import nothing of the project themselves)
DB_MAY_IMPORT = {
    "orchestrator.core.states",
    "orchestrator.core.prediction",  # what the models predicted, CandidateRow.prediction
    "orchestrator.core.decision",  # a candidate's decision, decoded once (ledger/convert.py)
    "orchestrator.core.knobs",
    "orchestrator.core.metrics",
    "orchestrator.core.ranking",
    "orchestrator.core.redact",
    "orchestrator.core.bounds",  # the knob registry's search lists declare their ranges
    "orchestrator.core.proc",  # a lease's holder is a process of this host as pid:start (never a reused pid)
    "orchestrator.core.schema",  # Ledger.from_config reads the `ledger` group (LedgerConfig), the one opening
    "orchestrator.core.errors",
    "orchestrator.core.failures",
}


def test_db_package_imports_only_the_vocabularies():
    """Data flows one way: orchestrator/ledger/ imports nothing of the orchestrator above it but the stdlib-only
    state enums (shared with launch/, one owner of Slurm's words), the knob and metric registries (its ledger
    columns), the ranking rule (`best` ranks with it), the one masking of secrets (`mask`, `scrub`), what a
    process of this host is (`proc`: a lease's holder) and the typed config of the ledger (`schema`: from_config)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    paths = sorted((root / "orchestrator" / "ledger").rglob("*.py"))
    assert len(paths) > 10, "the walk found the ledger package"
    for path in paths:
        ours = [n for n in _imports(path) if n.split(".")[0] == "orchestrator"]
        outside = [n for n in ours if n.split(".")[:2] != ["orchestrator", "ledger"]]
        assert set(outside) <= DB_MAY_IMPORT, (path, outside)
    for vocab in DB_MAY_IMPORT:
        names = _imports(root / (vocab.replace(".", "/") + ".py"))
        assert all(n.split(".")[0] in sys.stdlib_module_names or n in DB_MAY_IMPORT for n in names), (vocab, names)


def trusted(item: CandidateIn, sweep: str, attempt: int, token: str, result: dict, **kw):
    """One job folder's trusted row (orchestrator/ledger/ingest.py `Trusted`) of `item` in `sweep`: a twin
    measure attempt at the full window on 1k dsv4_pro, `kw` overriding any field."""
    from orchestrator.ledger.ingest import Trusted

    row = dict(
        sweep=sweep,
        stage="1k",
        model="dsv4_pro",
        hardware="h200",
        workload="twin",
        config_yaml="{}",
        config_from="test",
        key=item.key,
        owner_key=item.key,
        layout=item.layout,
        predicted=item.predicted,
        round=0,
        decision=None,
        attempt=attempt,
        launch_token=token,
        fidelity="full",
        role="measure",
        simulated=True,
        result=result,
    )
    return Trusted(**{**row, **kw})


def test_ingest_stores_each_folder_once_by_token_and_an_older_attempt_never_becomes_the_latest(ledger):
    """orchestrator/ledger/ingest.py (`ledger ingest`): a measurement rebuilt from its job folder is stored once
    (by launch token), keeps its folder's attempt number, and one of an older attempt ingested after a newer
    one leaves the newer the candidate's latest; a number taken by another launch is skipped, not stored."""
    from orchestrator.ledger.ingest import ingest

    item = make_items(1)[0]

    def found(attempt: int, token: str, step_s: float):
        return trusted(
            item,
            "rebuilt",
            attempt,
            token,
            job_result(step_s),
            hardware="h100",
            round=2,
            decision={"kind": "neighbour"},
            job_dir=f"/runs/rebuilt/c1/attempt-{attempt}",
            job_id=f"{100 + attempt}",
        )

    out = ingest(ledger, [found(2, "rebuilt.b", 1.0)], source="/runs/rebuilt")
    assert (len(out.ingested), len(out.present), out.skipped) == (1, 0, [])
    out = ingest(ledger, [found(1, "rebuilt.a", 2.0), found(2, "rebuilt.b", 1.0)], source="/runs/rebuilt")
    assert (len(out.ingested), len(out.present)) == (1, 1)
    out = ingest(ledger, [found(1, "rebuilt.other", 3.0)], source="/runs/rebuilt")
    assert out.ingested == [] and "another launch" in out.skipped[0][1]
    (cand,) = ledger.candidates("rebuilt")
    atts = ledger.attempts(cand.id)
    assert [(a.attempt_no, a.launch_token, a.job_id) for a in atts] == [
        (1, "rebuilt.a", "101"),
        (2, "rebuilt.b", "102"),
    ]
    assert cand.round == 2 and cand.decision.kind == "neighbour" and cand.latest_attempt_id == atts[1].id
    (row,) = ledger.evidence.measured(sweep="rebuilt")
    assert row.attempt_id == atts[1].id and row.metrics["step_p50_s"] == 1.0
    assert "ingested" in ledger.get_sweep("rebuilt").provenance
    assert [e.kind for e in ledger.events("rebuilt", kind="ingested")] == ["ingested", "ingested"]


def test_ingest_stores_a_failure_as_the_driver_does_and_a_finalists_job_under_the_candidate_it_ran_for(ledger):
    """A trusted OOM comes back as the driver records it (class, detail, the stated capacity; the candidate
    failed, its latest attempt); twice adds nothing. A finalist's job of a candidate in no row is skipped; a
    shared parity reference (its own layout key) is an attempt of the finalist it ran for, never a measurement."""
    from orchestrator.ledger.ingest import ingest

    a, b = make_items(2)
    oom = JobResult(
        ok=False,
        simulated=True,
        failure_class="OOM",
        failure_detail="torch.OutOfMemoryError: CUDA out of memory. GPU 0 has a total capacity of 96.00 GiB",
        gpu_capacity_gb=103.079215104,
        gpu_capacity_source="OOM message",
        slurm_state="FAILED",
        exit_code=1,
    ).to_dict()

    def found(item, attempt: int, token: str, result: dict, role: str = "measure", owner: str = ""):
        return trusted(
            item,
            "back",
            attempt,
            token,
            result,
            role=role,
            owner_key=owner or item.key,
            job_dir=f"/runs/back/{item.key[:6]}/{role}-{attempt}",
            job_id=f"{200 + attempt}",
        )

    ref = found(b, 2, "back.f", job_result(1.0), role="parity-reference", owner=a.key)  # b's layout, a's attempt
    out = ingest(ledger, [ref, found(a, 1, "back.m", oom)], source="/runs/back")
    assert len(out.ingested) == 2 and out.kinds == {"failed": 1, "finalists": 1} and out.finalists == ["back"]
    (cand,) = ledger.candidates("back")  # b is no candidate: its layout ran only as a's reference
    assert cand.key == a.key and cand.status == "failed" and cand.reason.startswith("OOM: ")
    m, r = ledger.attempts(cand.id, roles=None)
    assert (m.role, m.state, m.failure_class, m.exit_code) == ("measure", "FAILED", "OOM", 1)
    assert "CUDA out of memory" in (m.failure_detail or "")
    assert cand.latest_attempt_id == m.id and ledger.evidence.result(m.id) is None
    assert (r.role, r.attempt_no) == ("parity-reference", 2) and ledger.evidence.result(r.id) is not None
    assert ledger.evidence.measured(sweep="back") == []  # a finalist's result is no measurement
    assert [(c.gb, c.source) for c in ledger.evidence.gpu_capacities("back")] == [(103.079215104, "OOM message")]

    out = ingest(ledger, [ref, found(a, 1, "back.m", oom)], source="/runs/back")  # again: nothing added
    assert out.ingested == [] and len(out.present) == 2
    out = ingest(ledger, [found(b, 1, "back.x", job_result(1.0), role="parity")], source="/runs/back")
    assert out.ingested == [] and "in no ledger row" in out.skipped[0][1]
    assert len(ledger.attempts(cand.id, roles=None)) == 2


@pytest.mark.long
@pytest.mark.parametrize("field", ["stage", "model", "hardware", "workload", "gpus", "launcher"])
def test_ingest_refuses_folders_of_another_sweep_of_the_same_name_and_writes_nothing(ledger, ledger_url, field):
    """Issue 45 item 1: a folder whose stage, model, hardware, workload, GPU count or launcher differ from the
    ledger's sweep of its name (or, with no such sweep yet, from the other folders of that name) is another
    sweep: one LedgerError naming the field and a fix, and not a row written."""
    from orchestrator.ledger.ingest import ingest
    from tests.sweeplib import ledger_rows

    a, b = make_items(2)
    same = dict(gpus=1024, launcher="local", config_yaml="stage:\n  name: 1k\n  gpus: 1024\n")
    other = {"stage": "smoke", "model": "tiny", "hardware": "gb200", "workload": "megatron", "gpus": 32}
    other["launcher"] = "slurm"
    first = trusted(a, "k0", 1, "k0.a", job_result(1.0), job_dir="/runs/k0/a/attempt-1", **same)
    stranger = trusted(b, "k0", 1, "k0.b", job_result(0.03), job_dir="/elsewhere/k0/b/attempt-1", **same)
    stranger = dataclasses.replace(stranger, **{field: other[field]})

    # no sweep k0 yet: the identity of the folder ingest reads first (in its own order), the other one refused
    pair = {str(first_value := getattr(first, field)), str(other[field])}
    with pytest.raises(LedgerError, match=rf"{field} \S+ \(not \S+\).*ledger.url=") as err:
        ingest(ledger, [first, stranger], source="/runs/k0")
    said = re.search(rf"{field} (\S+) \(not (\S+)\)", str(err.value))
    assert said is not None and set(said.groups()) == pair, (str(err.value), first_value)
    assert "\n" not in str(err.value) and {"/elsewhere/k0/b/attempt-1", "/runs/k0/a/attempt-1"} <= set(
        re.findall(r"/\S+/attempt-1", str(err.value))
    )
    assert ledger.get_sweep("k0") is None

    out = ingest(ledger, [first], source="/runs/k0")
    assert len(out.ingested) == 1 and ledger.get_sweep("k0").provenance["launcher"] == "local"
    before = ledger_rows(ledger_url)
    with pytest.raises(LedgerError, match=rf"{field} {other[field]} \(not .*the ledger's sweep k0"):
        ingest(ledger, [stranger], source="/elsewhere/k0")
    assert ledger_rows(ledger_url) == before  # not a row written
    out = ingest(ledger, [dataclasses.replace(stranger, **{field: getattr(first, field)})], source="/runs/k0")
    assert len(out.ingested) == 1  # the same folder, of this sweep, is stored
