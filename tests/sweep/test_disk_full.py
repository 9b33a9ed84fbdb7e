"""A full disk under the job folders: one `error:` line naming the folder and exit 2 (it was an OSError
traceback), and `resume` finishes the sweep once there is space again."""

from __future__ import annotations

import errno
import os

import pytest

from orchestrator.cli import main
from orchestrator.core.spec import JobSpec
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import ROOT, ledger_url, sweep_args


@pytest.mark.long
def test_a_full_disk_is_one_error_line_and_resume_finishes_once_space_is_back(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    args = sweep_args(tmp_path, "full", "policy.schedule.round0_size=1", "stage.budget.max_rounds=1")
    real_save = JobSpec.save

    def full(self, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(JobSpec, "save", full)
    assert main(["sweep", *args, "--plain"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no space left on "), err
    assert str(tmp_path / "runs" / "full") in err[0] and "free space there" in err[0]
    assert f"then `python -m orchestrator resume full ledger.url={ledger_url(tmp_path)}" in err[0]

    monkeypatch.setattr(JobSpec, "save", real_save)  # space is back
    assert main(["resume", "full", f"ledger.url={ledger_url(tmp_path)}", "--plain"]) == 0, capsys.readouterr()
    with Ledger.open(ledger_url(tmp_path), create=False) as led:
        (cand,) = led.candidates("full")
        assert [a.state for a in led.attempts(cand.id)] == ["COMPLETED"]
