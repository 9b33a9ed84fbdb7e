"""A sweep stopped from outside names its real cause and how to go on (issue 45 item 6): a ledger locked past its
busy timeout (it read "the ledger ... lost its schema while in use"), a full disk when a result is written (an
OSError traceback from `paths.atomic_write`), SIGTERM (exit 143 and not a word). Each is one line on stderr that
ends with the `resume` command of the sweep, with the ledger it was given; `resume` then goes on."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.core.paths import JobPaths
from orchestrator.core.states import AttemptState, SweepStatus
from orchestrator.evidence.ingest import judge
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import ROOT, all_attempts, ledger_url, running_sweep, sweep_args, wait_for

ONE = ("policy.schedule.round0_size=1", "stage.budget.max_rounds=1")


def _resume_hint(tmp_path, name: str) -> str:
    """The start of the command the line ends with (the sweep's other ledger overrides follow the URL)."""
    return f"`python -m orchestrator resume {name} ledger.url={ledger_url(tmp_path)}"


@pytest.mark.long
def test_a_ledger_locked_past_the_busy_timeout_stops_the_sweep_naming_the_lock(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    path = tmp_path / "ledger.sqlite"
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); sys.stdin.read()"
    )
    holders: list[subprocess.Popen] = []
    real = Ledger.launched

    def lock_then_record(self, rows):
        if not holders:  # the first job ids are being recorded: a `sqlite3` shell holds the write lock now
            # once the job runs (it runs for seconds): the cancel that follows the failed record stops a running
            # job, the order CI met, and resume must still run its layout again
            wait_for(lambda: list((tmp_path / "runs").rglob(JobPaths.STARTED)), 120, "the job's start record")
            holders.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
            )
            assert holders[0].stdout is not None and holders[0].stdout.readline().strip() == "held"
        return real(self, rows)

    monkeypatch.setattr(Ledger, "launched", lock_then_record)
    slow = ("++workload.twin.time_scale=100000", "++workload.twin.max_sleep_s=1.0", "stage.measure_iters=4")
    args = sweep_args(tmp_path, "locked", *ONE, *slow, "ledger.busy_timeout_ms=300")
    try:
        assert main(["sweep", *args, "--plain"]) == 2
    finally:
        for h in holders:  # the transaction ends
            assert h.stdin is not None
            h.stdin.close()
            h.wait(timeout=60)
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln]
    assert len(err) == 1 and err[0].startswith(f"error: the ledger {path} is locked: pid {holders[0].pid} ("), err
    assert "held its write lock longer than ledger.busy_timeout_ms" in err[0] and "lost its schema" not in err[0]
    assert f"then {_resume_hint(tmp_path, 'locked')}" in err[0] and err[0].endswith("`"), err[0]

    # the folder says its launch was cancelled unrecorded: once the job has stopped, ingest keeps it out too
    (mark,) = (tmp_path / "runs").rglob(JobPaths.ABORTED)
    wait_for(lambda: JobPaths(mark.parent).exited.exists(), 120, "the cancelled job's exit marker")
    assert "cancelled by its sweep before its job id was recorded" in (judge(mark.parent).skipped or "")

    monkeypatch.setattr(Ledger, "launched", real)
    assert main(["resume", "locked", f"ledger.url={ledger_url(tmp_path)}", "--plain"]) == 0, capsys.readouterr()
    with Ledger.open(ledger_url(tmp_path), create=False) as led:
        assert led.evidence.measured(sweep="locked")
        first, *rest = all_attempts(led, "locked")  # the cancelled one is released, never read as the layout's crash
    assert first.state == AttemptState.CANCELLED and first.failure_class is None, first
    assert JobPaths(first.job_dir).aborted.exists() and [a.state for a in rest] == [AttemptState.COMPLETED]


@pytest.mark.long
def test_a_full_disk_when_a_result_is_written_is_one_line_and_resume_collects_it(tmp_path, monkeypatch, capsys):
    import orchestrator.evidence.collect as collect

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    real = collect.atomic_write

    def full(path, data, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(collect, "atomic_write", full)  # `collect.write_result`'s write, where the traceback was
    assert main(["sweep", *sweep_args(tmp_path, "nospace", *ONE), "--plain"]) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln]
    assert len(err) == 1 and err[0].startswith(f"error: no space left on {tmp_path / 'runs' / 'nospace'}/"), err
    assert "free space there" in err[0] and f"then {_resume_hint(tmp_path, 'nospace')}" in err[0], err[0]

    monkeypatch.setattr(collect, "atomic_write", real)  # space is back: the job ended, resume collects it
    assert main(["resume", "nospace", f"ledger.url={ledger_url(tmp_path)}", "--plain"]) == 0, capsys.readouterr()
    with Ledger.open(ledger_url(tmp_path), create=False) as led:
        (attempt,) = all_attempts(led, "nospace")
        assert attempt.state == AttemptState.COMPLETED and led.evidence.result(attempt.id) is not None


@pytest.mark.long
def test_sigterm_says_the_sweep_stopped_and_how_to_resume(tmp_path):
    # each iteration sleeps its max_sleep_s: the job outlives the moment the signal is sent by about a minute
    slow = [
        "++workload.twin.time_scale=100000",
        "++workload.twin.max_sleep_s=2.0",
        "stage.warmup_iters=2",
        "stage.measure_iters=25",
        *ONE,
    ]
    with running_sweep(sweep_args(tmp_path, "term", *slow), log=tmp_path / "run.log") as run:
        try:
            wait_for(lambda: "submitted 1 job(s)" in run.output(), 120, "the driver's line that its job went out")
            run.proc.send_signal(signal.SIGTERM)  # while it waits on its job
            assert run.wait(60) == 128 + signal.SIGTERM, run.output()[-2000:]
        finally:
            try:  # its local job, in the driver's process group, is not the test's to leave behind
                os.killpg(run.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    last = run.output().strip().splitlines()[-1]
    assert last.startswith(f"stopped on SIGTERM: the sweep's jobs keep running; {_resume_hint(tmp_path, 'term')}")
    assert last.endswith("` continues it"), run.output()[-2000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert led.get_sweep("term").status == SweepStatus.INTERRUPTED
        assert led.events("term", kind="stop")[-1].message == "driver stopped: SIGTERM"
        assert led.events("term", kind="lease")[-1].message.startswith("lease released")


def test_a_full_disk_in_any_command_is_one_line(tmp_path, monkeypatch, capsys):
    """Outside a sweep (a report, an export): the same line, and running the command again is the way on."""
    import orchestrator.commands.report as report

    def full(args, overrides):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "reports" / "s" / "report.html"))

    monkeypatch.setattr(report, "run", full)
    assert main(["report", "s"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: no space left on {tmp_path / 'reports' / 's'} (No space left on device): free space there, "
        "then run the command again"
    ], err
