"""Alembic revisions: N-1 with data upgrades intact, a too-new database is refused, models == migrations."""

from __future__ import annotations

from datetime import datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import insert, inspect, select, text

from orchestrator.core.knobs import Layout
from orchestrator.ledger import engine as E
from orchestrator.ledger import models as m
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.ledger import Ledger
from tests.ledger.test_db_queries import run_cli


def revisions() -> list[str]:
    return [r.revision for r in reversed(list(E.script_directory().walk_revisions()))]


def test_at_least_two_revisions_in_a_line():
    revs = revisions()
    assert len(revs) >= 2 and revs[-1] == E.head_revision()


def test_the_fast_path_head_is_alembics_head():
    """A new migration must move engine.HEAD with it: a ledger at the old HEAD would otherwise skip the check
    against alembic's scripts and open without being upgraded."""
    assert E.head_revision() == E.HEAD


def test_a_ledger_at_head_opens_without_alembic_and_any_other_revision_with_it(ledger_url):
    """Opening a ledger at HEAD reads its revision with one SELECT, in a fresh process with no alembic imported;
    one a revision behind is found behind (alembic's check) and upgraded."""
    import subprocess
    import sys

    eng = E.make_engine(ledger_url)
    try:
        previous = revisions()[-2]
        E.upgrade(eng, previous)
        behind = E.schema_state(eng)
        assert (behind.current, behind.up_to_date, behind.has_tables) == (previous, False, True)
        assert E.upgrade(eng).current == E.HEAD
    finally:
        eng.dispose()
    probe = (
        "import sys\n"
        "from orchestrator.ledger import engine as E\n"
        f"state = E.schema_state(E.make_engine({ledger_url!r}))\n"
        "print(state.current, state.up_to_date, 'alembic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == [E.HEAD, "True", "False"]


def test_upgrade_from_previous_revision_keeps_data(ledger_url):
    previous = revisions()[-2]
    eng = E.make_engine(ledger_url)
    try:
        assert E.upgrade(eng, previous).current == previous
        now = datetime(2026, 1, 1)
        with eng.begin() as conn:
            sweep_id = conn.execute(
                insert(m.Sweep.__table__)
                .values(
                    name="old",
                    stage="1k",
                    model="dsv4_pro",
                    hardware="h100",
                    workload="twin",
                    config_yaml="a: 1",
                    status="running",
                    provenance={"project": "0.0.9"},
                    created_at=now,
                    updated_at=now,
                )
                .returning(m.Sweep.__table__.c.id)
            ).scalar_one()
            cand_id = conn.execute(  # the columns of revision N-1 only (the model's defaults name the new one)
                text(
                    "INSERT INTO candidate (sweep_id, key, tp, pp, vpp, cp, ep, etp, mbs, recompute, offload,"
                    " dispatcher, use_tp_pp_dp_mapping, layer_pattern, layout, predicted, verdict, round, status,"
                    " created_at, updated_at) VALUES (:s, :k, 1, 8, 1, 1, 64, 1, 1, 'none', 'none', 'alltoall',"
                    " :f, '', :lay, '{}', 'legal', 0, 'planned', :now, :now) RETURNING id"
                ),
                {"s": sweep_id, "k": "k" * 32, "f": False, "lay": '{"ep": 64}', "now": now},
            ).scalar_one()
            conn.execute(  # the columns of revision N-1 only (the model's defaults name the new one)
                text(
                    "INSERT INTO attempt (candidate_id, attempt_no, job_id, job_dir, state, log_paths, sidecar_paths,"
                    " simulated, created_at, updated_at) VALUES (:c, 1, '7', '/r/a-1', 'COMPLETED', '[]', '[]',"
                    " :t, :now, :now)"
                ),
                {"c": cand_id, "t": True, "now": now},
            )
        # what the head revision (0013: each candidate's compute precision) adds is not there yet at N-1
        assert "precision" not in {c["name"] for c in inspect(eng).get_columns("candidate")}
        if eng.dialect.name != "sqlite":  # a team database is never upgraded behind the user's back
            with pytest.raises(LedgerError, match=f"schema revision {previous}.*db upgrade"):
                Ledger.open(ledger_url)
        assert E.upgrade(eng).up_to_date
        assert "precision" in {c["name"] for c in inspect(eng).get_columns("candidate")}
        with eng.connect() as conn:  # a candidate stored before 0013 ran the stage's BF16 (before 0012: FP32 state)
            assert conn.execute(text("SELECT precision, optim FROM candidate")).one() == ("bf16", "fp32")
    finally:
        eng.dispose()
    with Ledger.open(ledger_url) as led:
        (sweep,) = led.list_sweeps()
        assert (sweep.name, sweep.status, sweep.provenance) == ("old", "running", {"project": "0.0.9"})
        (cand,) = led.candidates("old")
        assert cand.layout == Layout(ep=64) and cand.created_at.year == 2026 and not cand.decision.stored
        (att,) = led.attempts(cand.id)  # an attempt stored before revision 0009 measured its candidate
        assert (att.job_id, att.role) == ("7", "measure")
        led.evidence.record_calibration("old", 0, {"truth_a2a": 1.2}, {"mape": 0.05})  # the new table works
        assert len(led.evidence.calibrations("old")) == 1


def test_too_new_database_is_refused(ledger_url):
    Ledger.open(ledger_url).close()
    eng = E.make_engine(ledger_url)
    with eng.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    eng.dispose()
    with pytest.raises(LedgerError, match="revision 9999, newer than this code"):
        Ledger.open(ledger_url)


def test_models_match_migrations(ledger_url):
    eng = E.make_engine(ledger_url)
    try:
        E.upgrade(eng)
        with eng.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, m.Base.metadata) == []
    finally:
        eng.dispose()


def test_concurrent_first_open_upgrades_once(ledger_url):
    """Eight orchestrators starting on a fresh ledger: one upgrade, no error (lock in
    orchestrator.ledger.engine.upgrade)."""
    from concurrent.futures import ThreadPoolExecutor

    def open_close(_):
        with Ledger.open(ledger_url) as led:
            return led.url

    with ThreadPoolExecutor(8) as pool:
        assert len(list(pool.map(open_close, range(8)))) == 8
    eng = E.make_engine(ledger_url)
    with eng.connect() as conn:
        assert conn.execute(select(text("count(*)")).select_from(text("alembic_version"))).scalar() == 1
    eng.dispose()


@pytest.mark.long
def test_cli_db_upgrade_current_history(ledger_url, capsys):
    url = f"ledger.url={ledger_url}"
    rc, out, _ = run_cli(["db", "current", url], capsys)
    assert rc == 0 and ("none (empty database)" in out or "no file yet" in out)
    rc, out, _ = run_cli(["db", "upgrade", "--revision", revisions()[0], url], capsys)
    assert rc == 0 and f"upgraded from empty to {revisions()[0]}" in out
    rc, out, _ = run_cli(["db", "current", url], capsys)
    assert rc == 0 and "behind head" in out
    rc, out, _ = run_cli(["db", "upgrade", url], capsys)
    assert rc == 0 and f"to {E.head_revision()}" in out
    rc, out, _ = run_cli(["db", "history", url], capsys)
    assert rc == 0 and f"{E.head_revision()} (head)" in out and len(out.splitlines()) == len(revisions())
    rc, _, err = run_cli(["db", "current", "ledger.url=postgresql+psycopg://u:hunter2@127.0.0.1:1/x"], capsys)
    assert rc == 2 and "hunter2" not in err and "u:***@" in err and err.count("\n") == 1
