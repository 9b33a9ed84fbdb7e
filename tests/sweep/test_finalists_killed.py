"""kill -9 during the finalists, then `resume`: each finalist job ran exactly once, every verdict is recorded,
and every job is charged once (issue 17: every job is an attempt).

Before, the finalists' jobs were submitted and awaited by a second driver and only logged as events after
`submit()` returned: a kill while they ran re-submitted them on resume, uncharged. Now each is an attempt
of its candidate with a role, launched through the driver's one launch path, so resume adopts what runs and
collects what ended. Faults: kill -9 of the orchestrator alone while a finalist's job runs (the job lives on
as an orphan, and must be collected, not launched again), and ORCH_FAULT (orchestrator/sweep/faults.py
fault_point) between the intents and the launch (`finalists-intent:kill`) and between the launch and its
record (`finalists-record:kill`). On SQLite and PostgreSQL (`ledger_url`), on the local launcher; the
real-Slurm variant is at the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import history
from orchestrator.core.paths import JobPaths
from orchestrator.core.states import AttemptRole, CandidateStatus
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import FINALISTS_SWEEP, cli, last_iteration, running_sweep, sweep_args, wait_for

STEPS = 20  # parity.steps (the default): a parity job lasts ~STEPS x 0.25 s
FINALISTS = [
    *FINALISTS_SWEEP,
    "++workload.twin.diverge_when={cp: 4}",
    "++workload.twin.time_scale=1",
    "++workload.twin.max_sleep_s=0.25",  # ~0.25 s per iteration: jobs stay running long enough to be killed
    "++cluster.local.max_workers=4",
]


def _args(tmp_path: Path, name: str, url: str, *extra: str) -> list[str]:
    args = sweep_args(tmp_path, name, *FINALISTS, *extra, stage="slice")
    return [a if not a.startswith("ledger.url=") else f"ledger.url={url}" for a in args]


def _finalist_folders(tmp_path: Path, name: str) -> set[str]:
    """Every finalist job folder on disk that a job ran in (it wrote rank logs), whoever launched it."""
    root = tmp_path / "runs" / name
    return {
        str(p)
        for role in AttemptRole.FINALIST
        for p in root.glob(f"*/{role}-*")
        if p.is_dir() and JobPaths(p).rank_logs()
    }


def _resume(name: str, url: str, env: dict | None = None) -> None:
    proc = cli("resume", name, f"ledger.url={url}", "--plain", timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]


def assert_finalists_ran_once(led: Ledger, name: str, folders: set[str]) -> dict:
    """Each finalist job ran exactly once (one attempt that ran per candidate and role, each in its own
    folder, and no job ran outside the ledger), every verdict is recorded, each job charged once."""
    (pick,) = [e.data["keys"] for e in led.events(name, kind="finalists")]  # picked once, resume included
    cands = {c.key: c for c in led.candidates(name)}
    ran: dict[tuple[int, str], list] = {}
    for c in cands.values():
        for a in led.attempts(c.id, roles=AttemptRole.FINALIST):
            if not a.aborted:  # an intent that never reached the launcher is no run
                ran.setdefault((c.id, a.role), []).append(a)
    twice = {k: [a.job_id for a in v] for k, v in ran.items() if len(v) != 1}
    assert not twice, twice
    atts = [v[0] for v in ran.values()]
    assert all(a.job_id and led.evidence.result(a.id) is not None for a in atts), [
        (a.role, a.job_id, a.state) for a in atts
    ]
    assert {a.job_dir for a in atts} == folders  # every job that ran is the ledger's, and nothing else ran
    assert len(atts) == len(folders)
    # verdicts: one parity row per finalist; a failing one is excluded; a long-run window for each that passed
    for key in pick:
        c = cands[key]
        (row,) = led.evidence.parity(c.id)
        if c.layout.cp == 4:
            assert not row.passed and c.status == CandidateStatus.EXCLUDED
            assert not led.events(name, kind="long-run", candidate_id=c.id)
        else:
            assert row.passed and c.status == CandidateStatus.DONE, (row.detail, c.status)
            (ev,) = led.events(name, kind="long-run", candidate_id=c.id)
            assert ev.data["ok"] and led.evidence.result(ev.data["attempt_id"])["q_effective"] > 0, ev.data
    # charged once: one cost row per job that ran (an aborted intent costs nothing), no event charges besides
    costs = [x for x in queries.attempt_costs(led, name) if x.role != AttemptRole.MEASURE]
    assert sum(1 for x in costs if x.step_mean_s or x.start_time) == len(atts)
    assert not led.events(name, kind="finalist-cost")
    spent = history.spent(led, name, stage=_stage(led, name))
    assert spent.by_fidelity["finalists"] > 0
    # a finalist's job is never the candidate's measurement
    assert all(m.attempt_no == 1 for m in led.evidence.measured(sweep=name))
    return {"jobs": len(atts), "pick": len(pick)}


def _stage(led: Ledger, name: str):
    from orchestrator.config import root_from_yaml

    return root_from_yaml(led.get_sweep(name).config_yaml).required_stage()


@pytest.mark.long
@pytest.mark.parametrize("role", [AttemptRole.PARITY, AttemptRole.LONG_RUN_SAVE])
def test_kill_9_while_a_finalists_job_runs_then_resume_runs_it_once(tmp_path, ledger_url, role):
    name = f"fk-{role}"
    args = _args(tmp_path, name, ledger_url)
    length = STEPS if role == AttemptRole.PARITY else 6

    def running() -> list[str]:  # a job of `role` inside its window, not at its end
        longer = [r for r in AttemptRole if r != role and r.startswith(role)]  # parity-reference is no parity job
        got = [
            p
            for p in _finalist_folders(tmp_path, name)
            if Path(p).name.startswith(f"{role}-") and not any(Path(p).name.startswith(f"{r}-") for r in longer)
        ]
        return [p for p in got if 0 < last_iteration(p) < length - 1]

    with running_sweep(args, log=tmp_path / "first.log") as run:
        mid = wait_for(running, 300, f"a {role} job inside its window", every=0.05)
        run.kill()  # the orchestrator only: its local jobs live on
    assert all(last_iteration(p) < length for p in mid)
    _resume(name, ledger_url)
    with Ledger.open(ledger_url) as led:
        got = assert_finalists_ran_once(led, name, _finalist_folders(tmp_path, name))
        for p in mid:  # the job killed with its orchestrator was collected (adopted), not launched again
            (a,) = [a for c in led.candidates(name) for a in led.attempts(c.id, roles=None) if a.job_dir == p]
            assert a.role == role and led.evidence.result(a.id) is not None
    print(f"killed during {role}: {got}")


@pytest.mark.long
@pytest.mark.parametrize("point", ["finalists-intent", "finalists-record"])
def test_kill_9_between_a_finalists_intent_and_its_record_then_resume_launches_once(tmp_path, ledger_url, point):
    name = f"fi-{point.split('-')[1]}"
    proc = cli("sweep", *_args(tmp_path, name, ledger_url), "--plain", timeout=600, env={"ORCH_FAULT": f"{point}:kill"})
    assert proc.returncode == -9, proc.stderr[-3000:] + proc.stdout[-3000:]
    with Ledger.open(ledger_url) as led:
        intents = [a for c in led.candidates(name) for a in led.attempts(c.id, roles=AttemptRole.FINALIST)]
        assert intents and not any(a.job_id for a in intents)  # written before the launch, no id recorded
        assert all(a.launch_token for a in intents)
        measured = {m.candidate_id for m in led.evidence.measured(sweep=name)}
        assert len(measured) == 4  # the search's measurements were all in before the finalists began
    if point == "finalists-record":  # the one job launched before the kill lives on (its folder says so)
        launched = wait_for(lambda: _finalist_folders(tmp_path, name), 60, "the launched job's rank logs")
        assert len(launched) == 1, launched
    else:
        launched = _finalist_folders(tmp_path, name)
        assert not launched, launched  # killed before the launch: nothing ran
    _resume(name, ledger_url)
    with Ledger.open(ledger_url) as led:
        assert_finalists_ran_once(led, name, _finalist_folders(tmp_path, name))
        if point == "finalists-record":  # the job launched before the kill was adopted, not launched again
            (p,) = launched
            (a,) = [a for c in led.candidates(name) for a in led.attempts(c.id, roles=None) if a.job_dir == p]
            assert a.job_id and any("adopted on resume" in e.message for e in led.events(name, kind="launched"))


# ---- the real local Slurm -----------------------------------------------------------------------------


@pytest.mark.slurm
def test_slurm_kill_between_a_finalists_sbatch_and_its_record_is_adopted_on_resume(tmp_path, slurm_cluster):
    """On Slurm the finalists' jobs go out as one array named by its launch token; killed before the job ids
    are stored, resume finds the array by its token (one sacct query) and adopts it: no second sbatch."""
    from tests.sweeplib import assert_slurm_accounted, ledger_url, slurm_shims

    shims = slurm_shims(tmp_path)
    node8 = ["stage.gpus=8", "++cluster.poll_interval_s=1.0", "++cluster.min_time_min=5", "++cluster.signal_delay_s=30"]
    extra = [
        "++parity.enabled=true",
        "++parity.reference={ep: 8}",  # the smoke stage's fastest layouts are EP4: their reference is a job
        "++effective.long_run=true",
        "++effective.long_run_save_at=4",
        "++effective.long_run_after_iters=4",
        "policy.search.promote_top_k=2",
        "policy.schedule.round0_size=3",
        "stage.budget.max_rounds=1",
        *node8,
    ]
    name, url = "fs-record", ledger_url(tmp_path)
    args = sweep_args(tmp_path, name, *extra, cluster="slurm")
    proc = cli("sweep", *args, "--plain", timeout=600, env={"ORCH_FAULT": "finalists-record:kill", **shims.env})
    assert proc.returncode == -9, proc.stderr[-3000:] + proc.stdout[-3000:]
    with Ledger.open(url) as led:
        intents = [a for c in led.candidates(name) for a in led.attempts(c.id, roles=AttemptRole.FINALIST)]
        assert intents and not any(a.job_id for a in intents) and len({a.launch_token for a in intents}) == 1
    sbatched = len(shims.submitted())
    assert sbatched == 2, shims.submitted()  # the measurements' array, then the finalists' (never recorded)
    _resume(name, url, env=shims.env)
    with Ledger.open(url) as led:
        got = assert_finalists_ran_once(led, name, _finalist_folders(tmp_path, name))
        adopted = [e for e in led.events(name, kind="launched") if "adopted on resume" in e.message]
        assert len(adopted) == len(intents)  # the whole array, by its token
        assert_slurm_accounted(led, name, shims)  # 0 untracked, 0 run twice, 0 lost, finalists' jobs included
    assert got["jobs"] > len(intents)  # the later finalists' jobs (long-run windows) went out after resume
    print(f"slurm: {got}, sbatch calls {len(shims.submitted())}")
