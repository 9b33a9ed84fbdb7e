"""Issue 10 fault 5: jobs killed together with their orchestrator (`kill -9 -- -PGID`) are measured again.

Before: `resume` found no process and no result.json for the local jobs, collected their half-written
folders, and recorded a partial window as a `done` result (never re-measured) or NO_OUTPUT (never retried).
A job that vanished before its measurement window ended is LOST: retried in a fresh attempt folder.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from orchestrator.core import proc as process
from orchestrator.core.failures import Failure
from orchestrator.core.states import CandidateStatus
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import (
    all_attempts,
    assert_accounted,
    cli,
    last_iteration,
    ledger_url,
    running_sweep,
    sweep_args,
    wait_for,
)

WARMUP, MEASURE = 3, 12
SLOW = [
    "++workload.twin.time_scale=50",
    "++workload.twin.max_sleep_s=0.5",  # ~0.5 s per iteration: a window of 12 lasts ~6 s
    f"stage.warmup_iters={WARMUP}",
    f"stage.measure_iters={MEASURE}",
    "policy.schedule.round0_size=2",
    "stage.budget.max_rounds=1",
    "cluster.local.max_workers=2",
]


@pytest.mark.long
def test_jobs_killed_with_their_orchestrator_are_measured_again(tmp_path):
    args = sweep_args(tmp_path, "killed", *SLOW)
    with running_sweep(args, log=tmp_path / "first.log") as run:
        atts = run.attempts(2, timeout=180)
        # the event: both jobs are inside their measurement window, neither has finished it
        wait_for(
            lambda: all(WARMUP < last_iteration(a.job_dir) < WARMUP + MEASURE - 2 for a in atts),
            180,
            "both jobs inside their measurement window",
            every=0.1,
        )
        os.killpg(run.proc.pid, signal.SIGKILL)  # kill -9 -- -PGID: the orchestrator and its local jobs
        run.proc.wait()
    killed = {a.id: last_iteration(a.job_dir) for a in atts}
    assert all(WARMUP < it < WARMUP + MEASURE for it in killed.values()), killed  # partial windows on disk
    proc = cli("resume", "killed", f"ledger.url={ledger_url(tmp_path)}", "--plain", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert_accounted(led, "killed")
        untracked = duplicates = lost = 0
        for c in led.candidates("killed"):
            cand = led.attempts(c.id)
            first, last = cand[0], cand[-1]
            if first.id in killed:  # killed mid-window: LOST, retried once in attempt-2, never a result
                assert first.failure_class == Failure.LOST and led.evidence.result(first.id) is None, first
                assert [Path(x.job_dir).name for x in cand] == ["attempt-1", "attempt-2"]
            assert c.status == CandidateStatus.DONE, (c.key, c.status)
            res = led.evidence.result(last.id)
            lost += res is None or bool(res["partial"]) or res["measure_iters"] != MEASURE
            duplicates += sum(1 for x in cand if led.evidence.result(x.id) is not None) - 1
        ids = [a.job_id for a in all_attempts(led, "killed")]
        untracked += sum(1 for j in ids if process.running(j))  # local job ids are `pid:start`: none still runs
        assert len({x.job_dir for x in all_attempts(led, "killed")}) == len(ids)  # no folder reused
    assert (untracked, duplicates, lost) == (0, 0, 0)
    print(f"killed at iterations {sorted(killed.values())}; untracked {untracked} duplicates {duplicates} lost {lost}")


@pytest.mark.long
def test_a_stray_result_in_a_running_jobs_folder_is_never_its_measurement(tmp_path):
    """Issue 22 item 4: the orchestrator is killed while its jobs run on; a result.json (3 measured iterations,
    ok) appears in each running job's folder. Before, `resume` took the file as the job's end: the re-attached
    job was COMPLETED, its half window stored as the candidate's measurement (and a best) while it ran on.
    Now only the job's own exit decides: each job is collected once it ended, with its whole window."""
    import json

    from orchestrator.core.paths import JobPaths

    long = 60  # ~0.5 s per iteration: the jobs still run when `resume` first polls them
    args = sweep_args(tmp_path, "stray", *SLOW, f"stage.measure_iters={long}")
    with running_sweep(args, log=tmp_path / "first.log") as run:
        atts = run.attempts(2, timeout=180)
        wait_for(
            lambda: all(WARMUP < last_iteration(a.job_dir) < WARMUP + 6 for a in atts),
            180,
            "both jobs inside their measurement window",
            every=0.1,
        )
        run.kill()  # the orchestrator only: its jobs live on
    for a in atts:
        JobPaths(a.job_dir).result.write_text(json.dumps({"ok": True, "measure_iters": 3, "partial": True}))
    proc = cli("resume", "stray", f"ledger.url={ledger_url(tmp_path)}", "--plain", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert_accounted(led, "stray")
        for a in atts:
            (again,) = [x for x in all_attempts(led, "stray") if x.id == a.id]
            res = led.evidence.result(a.id)
            assert res is not None and not res["partial"] and res["measure_iters"] == long, (again.state, res)
        assert len(all_attempts(led, "stray")) == 2  # adopted, nothing launched twice
        best = [line for line in proc.stdout.splitlines() if line.startswith("best layout")]
        assert best, proc.stdout[-2000:]
