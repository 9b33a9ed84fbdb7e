"""The ledger deleted, replaced or overwritten in place under a running sweep: the driver's next write
transaction sees that its ledger is not the file it opened, and the sweep stops at once with one `error:` line
(exit 2); nothing is written into a replacement or the copied-in file, and a deleted ledger is not silently
recreated."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from orchestrator.cli import main
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import ROOT, sweep_args


@pytest.mark.long
@pytest.mark.parametrize("how", ["deleted", "replaced", "overwritten in place"])
def test_the_sweep_stops_with_one_error_line_when_its_ledger_is_pulled_away(tmp_path, monkeypatch, capsys, how):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    path = tmp_path / "ledger.sqlite"
    other = tmp_path / "other.sqlite"
    with Ledger.open(f"sqlite:///{other}") as theirs:
        theirs.create_or_get_sweep(
            "theirs", stage="smoke", config_yaml="{}", model="m", hardware="h", workload="w", provenance={}
        )
    real = Ledger.launched
    pulled = []

    def pull_then_record(self, rows):
        if not pulled:  # the first job ids are being recorded: the ledger goes away now
            pulled.append(how)
            if how == "deleted":
                for f in tmp_path.glob("ledger.sqlite*"):
                    f.unlink()
            elif how == "replaced":
                shutil.copy(other, tmp_path / "swap")
                os.replace(tmp_path / "swap", path)
            else:  # `cp other.sqlite ledger.sqlite`: the same inode (issue 45 item 5)
                shutil.copyfile(other, path)
        return real(self, rows)

    monkeypatch.setattr(Ledger, "launched", pull_then_record)
    args = sweep_args(tmp_path, "pulled", "policy.schedule.round0_size=2", "stage.budget.max_rounds=3")
    assert main(["sweep", *args, "--plain"]) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln]
    assert len(err) == 1 and err[0].startswith(f"error: the ledger file {path} was "), err
    assert pulled == [how]
    if how == "deleted":
        assert not path.exists()
    else:  # the copied-in ledger is left as it was: nothing of this sweep's WAL was checkpointed into it
        if how != "replaced":
            assert path.read_bytes() == other.read_bytes()
        con = sqlite3.connect(path)
        assert con.execute("SELECT name FROM sweep").fetchall() == [("theirs",)]
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        con.close()
