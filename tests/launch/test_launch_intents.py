"""Launch + record is crash-consistent (issue 10, fault 3): an attempt is written as an intent (a token that
names the Slurm job) before sbatch, so a record that fails right after the launch, or a kill -9 between
sbatch returning and the job id being stored, neither leaves a job running untracked nor runs one twice.

ORCH_FAULT (orchestrator/sweep/faults.py fault_point) injects the fault at the record step: `record:fail`
raises as a ledger that cannot be written, `record:kill` makes the orchestrator SIGKILL itself.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from orchestrator.core import proc as process
from orchestrator.core.paths import JobPaths
from orchestrator.core.states import AttemptState, CandidateStatus
from orchestrator.launch.slurm.intents import parse
from orchestrator.ledger.ledger import Ledger
from tests.sweep.test_sweep_slurm import counting_sbatch, sbatch_calls
from tests.sweeplib import all_attempts, assert_accounted, cli, sweep_args, wait_for
from tests.sweeplib import ledger_url as sqlite_url

NODE8 = ["stage.gpus=8", "++cluster.poll_interval_s=1.0", "++cluster.min_time_min=5", "++cluster.signal_delay_s=30"]
ROUND = ["policy.schedule.round0_size=3", "stage.budget.max_rounds=1"]


def test_parse_squeue_and_sacct_lines():
    out: dict = {}
    parse("17_[1-2]|PENDING|sw.ab12\n16|COMPLETED|sw.cd34\n16.batch|COMPLETED|batch\n", out)
    parse("17_0|RUNNING|sw.ab12\n", out)
    assert {k: (v.job_id, v.state) for k, v in out.items()} == {
        ("sw.ab12", 1): ("17_1", AttemptState.PENDING),
        ("sw.ab12", 2): ("17_2", AttemptState.PENDING),
        ("sw.ab12", 0): ("17_0", AttemptState.RUNNING),
        ("sw.cd34", None): ("16", AttemptState.COMPLETED),
    }


def _intents(led: Ledger, sweep: str) -> list:
    return [a for a in all_attempts(led, sweep) if a.launch_token]


def _resume_and_check(tmp_path: Path, name: str, env: dict | None = None, url: str | None = None) -> list:
    """Resume; every candidate ends measured with exactly one attempt that has a job id (one launch each)."""
    url = url or sqlite_url(tmp_path)
    proc = cli("resume", name, f"ledger.url={url}", "--plain", timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    with Ledger.open(url) as led:
        cands = led.candidates(name)
        assert cands and all(c.status == CandidateStatus.DONE for c in cands), [c.status for c in cands]
        launched = []
        for c in cands:
            atts = led.attempts(c.id)
            ran = [a for a in atts if a.job_id]
            assert len(ran) == 1, [(a.attempt_no, a.job_id, a.state) for a in atts]
            assert all(a.aborted for a in atts if not a.job_id)  # intents that never ran: closed, not retried
            assert len({a.job_dir for a in atts}) == len(atts)  # no folder reused
            launched.append(ran[0])
        return launched


@pytest.mark.long
def test_local_record_failure_leaves_nothing_running_and_resume_launches_once(tmp_path, ledger_url):
    """On both ledgers (the fixture `ledger_url`: SQLite and the real PostgreSQL)."""
    args = sweep_args(tmp_path, "l-rec", *ROUND, "++workload.twin.time_scale=20", "++workload.twin.max_sleep_s=1.0")
    args = [a if not a.startswith("ledger.url=") else f"ledger.url={ledger_url}" for a in args]
    proc = cli("sweep", *args, "--plain", timeout=300, env={"ORCH_FAULT": "record:fail"})
    assert proc.returncode == 2 and "injected fault at record" in proc.stderr, proc.stderr[-3000:]
    with Ledger.open(ledger_url) as led:
        intents = _intents(led, "l-rec")
        assert len(intents) == 3 and not any(a.job_id for a in intents)  # written before the launch
    # local job ids are `pid:start` (the controller's pid and start time): pids wrap on a busy host (a CI run
    # met a killed job's pid in a resumed one), the pair names one process only
    killed = [
        json.loads(JobPaths(a.job_dir).launch.read_text())["job_id"]
        for a in intents
        if JobPaths(a.job_dir).launch.exists()
    ]
    assert killed, "the first job was launched before its record failed"
    assert all(process.parse(j) and process.parse(j)[1] for j in killed), killed

    def gone() -> bool:
        return not any(process.running(j) for j in killed)

    wait_for(gone, 120, "the unrecorded local job(s) to be stopped")  # 0 jobs left running
    launched = _resume_and_check(tmp_path, "l-rec", url=ledger_url)
    assert {a.job_id for a in launched}.isdisjoint(killed)  # none of them re-attached: each launched anew


# ---- the real local Slurm -----------------------------------------------------------------------------


def _slurm_jobs(tmp_path: Path, sweep: str) -> dict[str, AttemptState]:
    """Every task Slurm ever got for this sweep (submitit keeps a `<task id>_submitted.pkl` per submitted task),
    with its state from `sacct -j` (a pending array cancelled before it started is absent from sacct's time
    window, so the ids come from the files, not from a `--name` query)."""
    sub = tmp_path / "runs" / sweep / JobPaths.SUBMITIT
    ids = sorted(m.group(1) for p in sub.iterdir() if (m := re.fullmatch(r"(\d+(?:_\d+)?)_submitted\.pkl", p.name)))
    bases = sorted({i.split("_")[0] for i in ids})
    out = subprocess.run(
        ["sacct", "-X", "-P", "-n", "-j", ",".join(bases), "-o", "JobID,State,JobName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: dict = {}
    parse(out, found)
    states = {f.job_id: f.state for f in found.values()}
    return {i: states.get(i, AttemptState.UNKNOWN) for i in ids}


@pytest.mark.slurm
def test_slurm_record_failure_cancels_the_whole_array_and_resume_launches_once(tmp_path, slurm_cluster):
    env = counting_sbatch(tmp_path)
    slow = ["++workload.twin.time_scale=50", "++workload.twin.max_sleep_s=2.0"]
    args = sweep_args(tmp_path, "s-rec", *ROUND, *NODE8, *slow, cluster="slurm")
    proc = cli("sweep", *args, "--plain", timeout=300, env={"ORCH_FAULT": "record:fail", "PATH": env["PATH"]})
    assert proc.returncode == 2 and "injected fault at record" in proc.stderr, proc.stderr[-3000:]
    with Ledger.open(sqlite_url(tmp_path)) as led:
        intents = _intents(led, "s-rec")
        assert len(intents) == 3 and not any(a.job_id for a in intents)
        assert len({a.launch_token for a in intents}) == 1  # one array

    def all_cancelled() -> dict | None:
        jobs = _slurm_jobs(tmp_path, "s-rec")
        return jobs if jobs and all(st == AttemptState.CANCELLED for st in jobs.values()) else None

    first = wait_for(all_cancelled, 120, "every task of the unrecorded array to be cancelled (0 left running)")
    assert len(first) == 3 and sbatch_calls(env) == 1, first
    launched = _resume_and_check(tmp_path, "s-rec", env={"PATH": env["PATH"]})
    jobs = _slurm_jobs(tmp_path, "s-rec")
    ran = {j: st for j, st in jobs.items() if j not in first}
    assert sorted(ran) == sorted(a.job_id for a in launched), jobs  # one run per candidate, each recorded
    assert all(st == AttemptState.COMPLETED for st in ran.values()), jobs
    assert sbatch_calls(env) == 2  # the cancelled array, then one array on resume


@pytest.mark.slurm
def test_slurm_kill_between_sbatch_and_record_is_adopted_on_resume(tmp_path, slurm_cluster):
    env = counting_sbatch(tmp_path)
    args = sweep_args(tmp_path, "s-kill9", *ROUND, *NODE8, cluster="slurm")
    proc = cli("sweep", *args, "--plain", timeout=300, env={"ORCH_FAULT": "record:kill", "PATH": env["PATH"]})
    assert proc.returncode == -9, proc.stderr[-3000:]
    with Ledger.open(sqlite_url(tmp_path)) as led:
        intents = _intents(led, "s-kill9")
        assert len(intents) == 3 and not any(a.job_id for a in intents)  # sbatch ran, nothing recorded
        tokens = {a.launch_token for a in intents}
    assert sbatch_calls(env) == 1 and len(_slurm_jobs(tmp_path, "s-kill9")) == 3
    launched = _resume_and_check(tmp_path, "s-kill9", env={"PATH": env["PATH"]})
    with Ledger.open(sqlite_url(tmp_path)) as led:
        assert_accounted(led, "s-kill9")  # every attempt has a job id: the running array was adopted
        assert {a.launch_token for a in launched} == tokens
        assert len([e for e in led.events("s-kill9") if "adopted on resume" in e.message]) == 3
    jobs = _slurm_jobs(tmp_path, "s-kill9")
    assert sorted(jobs) == sorted(a.job_id for a in launched), jobs  # one job per candidate, all of them ours
    assert all(st == AttemptState.COMPLETED for st in jobs.values()), jobs
    assert sbatch_calls(env) == 1  # resume submitted nothing


# ---- the ledger side, on SQLite and PostgreSQL ----------------------------------------------------------


def test_intent_then_launched_and_a_late_launch_keeps_a_cancel(ledger_url):
    from tests.ledger.test_ledger import make_items

    with Ledger.open(ledger_url) as led:
        led.create_or_get_sweep(
            "s1", stage="1k", config_yaml="", model="dsv4_pro", hardware="h100", workload="twin", provenance={}
        )
        led.add_candidates("s1", make_items(2))
        a_c, b_c = led.claim_for_submission("s1", 10, "me")
        a = led.new_attempt(a_c.id, array_index=0, job_dir="/r/a/attempt-1", simulated=True, launch_token="s1.0001")
        b = led.new_attempt(b_c.id, array_index=1, job_dir="/r/b/attempt-1", simulated=True, launch_token="s1.0001")
        assert a.job_id is None and a.launch_token == "s1.0001" and not a.aborted and not a.terminal
        assert {x.id for x in led.live_attempts("s1")} == {a.id, b.id}  # what resume reconciles
        led.launched([(a.id, "77_0", 0)])
        (got,) = led.attempts(a_c.id)
        assert (got.job_id, got.array_index, led.candidates("s1")[0].status) == ("77_0", 0, CandidateStatus.SUBMITTED)
        assert got.submit_time is not None
        led.set_candidate_status(b_c.id, CandidateStatus.CANCELLED, "cancelled by `orchestrator cancel`")
        led.launched([(b.id, "77_1", 1)])  # recorded after the cancel: the id is kept, the cancel too
        assert led.candidates("s1")[1].status == CandidateStatus.CANCELLED
        assert led.attempts(b_c.id)[0].job_id == "77_1"
        c = led.new_attempt(a_c.id, job_dir="/r/a/attempt-2", simulated=True, launch_token="s1.0002")
        aborted = led.update_attempt(c.id, state=AttemptState.CANCELLED, failure_detail="launch aborted")
        assert aborted.aborted and aborted.attempt_no == 2
