"""The sweep loop on a REAL local Slurm cluster (tests/cluster, 4 nodes x 8 fake GPUs): sbatch arrays,
one sacct per poll, kill -9 + resume without duplicate sbatch calls, and Slurm's failure states.

Jobs use 8 GPUs (one node, one task per fake GPU running the twin) so four run at once.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.core.paths import JobPaths
from orchestrator.launch.slurm import sacct
from orchestrator.ledger.ledger import Ledger
from orchestrator.plan.ranks import evidence_ranks
from tests.sweeplib import (
    all_attempts,
    assert_accounted,
    assert_slurm_accounted,
    cli,
    first_running,
    last_iteration,
    ledger_url,
    running_sweep,
    sacct_runs,
    slurm_shims,
    sweep_args,
    wait_for,
    wrong_nodes,
)

pytestmark = pytest.mark.slurm
NODE8 = ["stage.gpus=8", "++cluster.poll_interval_s=1.0", "++cluster.min_time_min=5", "++cluster.signal_delay_s=30"]
SMALL = [
    "policy.schedule.round0_size=3",
    "policy.schedule.round_size=2",
    "stage.budget.max_rounds=2",
    "stage.budget.max_runs=6",
]
SLOW = ["++workload.twin.time_scale=50", "++workload.twin.max_sleep_s=2.0"]  # ~2 s per iteration: jobs stay RUNNING
LONG = ["stage.measure_iters=100"]  # ~3 minutes: a job the test cancels cannot end first, however loaded the box


def counting_sbatch(tmp_path: Path) -> dict:
    """A PATH entry whose `sbatch` logs each call and runs the real one: counts submissions across processes."""
    real = subprocess.run(["bash", "-lc", "command -v sbatch"], capture_output=True, text=True).stdout.strip()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "sbatch.calls"
    shim = bindir / "sbatch"
    shim.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "_log": str(log)}


def sbatch_calls(env: dict) -> int:
    p = Path(env["_log"])
    lines = p.read_text().splitlines() if p.exists() else []
    return sum(1 for ln in lines if ln.strip() != "--version")  # make_launcher probes `sbatch --version`


def base_ids(atts) -> set:
    return {str(a.job_id).split("_")[0] for a in atts}


def test_slurm_sweep_two_rounds_end_to_end(tmp_path, slurm_cluster):
    env = counting_sbatch(tmp_path)
    proc = cli(
        "sweep",
        *sweep_args(tmp_path, "s-e2e", *SMALL, *NODE8, cluster="slurm"),
        "--json",
        "--plain",
        timeout=600,
        env={"PATH": env["PATH"]},
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "cluster: slurm" in proc.stdout
    with Ledger.open(ledger_url(tmp_path)) as led:
        cands = led.candidates("s-e2e")
        assert {c.round for c in cands} == {0, 1}
        assert_accounted(led, "s-e2e")
        atts = all_attempts(led, "s-e2e")
        assert all(a.job_id and a.job_id.split("_")[0].isdigit() for a in atts)
        assert all(a.state == "COMPLETED" and a.node_list for a in atts if led.evidence.result(a.id))
        # each round went out as one array per launch shape (sbatch options hold for a whole array): its launches at
        # scale in one, its one-GPU rank probes in another; one sbatch call each
        round_of = {c.id: c.round for c in cands}
        shapes = {(round_of[a.candidate_id], a.fidelity == "probe") for a in atts}
        assert sbatch_calls(env) == len(base_ids(atts)) == len(shapes) >= 2
        assert led.evidence.measured(sweep="s-e2e") and led.evidence.calibrations("s-e2e")


def test_slurm_kill_9_then_resume(tmp_path, slurm_cluster):
    env = counting_sbatch(tmp_path)
    args = sweep_args(
        tmp_path, "s-kill", *SMALL, *NODE8, *SLOW, "stage.warmup_iters=3", "stage.measure_iters=4", cluster="slurm"
    )
    with running_sweep(args, log=tmp_path / "first.log", env={"PATH": env["PATH"]}) as run:
        run.attempts(1, timeout=180)
        run.kill()  # the orchestrator only
    with Ledger.open(ledger_url(tmp_path)) as led:
        before = {a.id: a.job_id for a in all_attempts(led, "s-kill")}
    calls_before = sbatch_calls(env)
    proc = cli(
        "resume", "s-kill", f"ledger.url={ledger_url(tmp_path)}", "--plain", timeout=600, env={"PATH": env["PATH"]}
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert_accounted(led, "s-kill")
        after = all_attempts(led, "s-kill")
        for aid, job in before.items():
            assert next(a for a in after if a.id == aid).job_id == job  # re-attached by stored id
        assert all(len(led.attempts(c.id)) == 1 for c in led.candidates("s-kill")), "a candidate was resubmitted"
        # the resumed process submitted only the later round(s): one sbatch per new array
        new_arrays = base_ids(after) - base_ids([a for a in after if a.id in before])
        assert sbatch_calls(env) - calls_before == len(new_arrays)
        assert calls_before == len(base_ids([a for a in after if a.id in before]))


@pytest.mark.slurm(shared=True)  # one 1-node job
def test_scancel_is_cancelled_and_not_retried(tmp_path, slurm_cluster):
    """The job is cancelled once it has printed iterations: sacct's ExitCode is then "0:15", which with
    iteration lines once read as a success (failure_class None) whenever the job was fast enough (issue 10)."""
    args = sweep_args(
        tmp_path,
        "s-cancel",
        "policy.schedule.round0_size=1",
        "stage.budget.max_rounds=1",
        *NODE8,
        *SLOW,
        *LONG,
        cluster="slurm",
    )
    with running_sweep(args, log=tmp_path / "run.log") as run:
        a = run.wait_ledger(lambda led: first_running(led, "s-cancel"), 180, "a RUNNING job")
        wait_for(lambda: last_iteration(a.job_dir) >= 1, 180, "the job's first iteration line")
        subprocess.run(["scancel", a.job_id], check=True)
        assert run.wait(300) == 1, run.output()[-3000:]  # its only job was cancelled: nothing measured
    with Ledger.open(ledger_url(tmp_path)) as led:
        (c,) = led.candidates("s-cancel")
        atts = led.attempts(c.id)
        assert c.status == "cancelled" and len(atts) == 1
        assert atts[0].state == "CANCELLED" and atts[0].failure_class == "CANCELLED"


def test_node_down_is_node_fail_and_retried_on_a_healthy_node(tmp_path, slurm_cluster):
    """Issue 10 fault 2: Slurm's own requeue reran the NODE_FAIL job under its id, into attempt-1, while the
    sweep retried it too. Jobs go out with --no-requeue: sacct --duplicates shows one run of the failed job,
    and the one retry runs in attempt-2 on healthy nodes."""
    shims = slurm_shims(tmp_path)
    args = sweep_args(
        tmp_path,
        "s-node",
        "policy.schedule.round0_size=1",
        "stage.budget.max_rounds=1",
        *NODE8,
        *SLOW,
        "stage.warmup_iters=3",
        "stage.measure_iters=4",
        cluster="slurm",
    )
    node = None
    try:
        with running_sweep(args, log=tmp_path / "run.log", env=shims.env) as run:
            a = run.wait_ledger(lambda led: first_running(led, "s-node"), 180, "a RUNNING job")
            node = a.node_list.split(",")[0]
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=sweep-test"], check=True)
            assert run.wait(400) == 0, run.output()[-3000:]
    finally:
        if node:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    with Ledger.open(ledger_url(tmp_path)) as led:
        (c,) = led.candidates("s-node")
        atts = led.attempts(c.id)
        assert atts[0].failure_class == "NODE_FAIL", [(x.state, x.failure_class) for x in atts]
        assert len(atts) == 2 and c.status == "done"
        # the retry ran to completion on healthy nodes: the sweep excluded the node(s) the first attempt failed on
        assert atts[1].state == "COMPLETED" and atts[1].node_list and led.evidence.result(atts[1].id) is not None
        assert node not in _expand(atts[1].node_list), (node, atts[1].node_list)
        # each attempt in its own folder; the failed one was never rerun (no second run, no result.json)
        assert [Path(x.job_dir).name for x in atts] == ["attempt-1", "attempt-2"]
        assert (
            not JobPaths(atts[0].job_dir).result.exists() or "NODE_FAIL" in JobPaths(atts[0].job_dir).result.read_text()
        )
        runs = sacct_runs([atts[0].job_id])
        assert runs == {atts[0].job_id: ["NODE_FAIL"]}, runs
        assert_slurm_accounted(led, "s-node", shims)


@pytest.mark.slurm(shared=True)  # one 1-node job that outlives its 2 minutes: beside the others
def test_time_limit_is_timeout(tmp_path, slurm_cluster):
    # A workload that ignores the early warning signal and outlives the 2-minute limit: Slurm kills it. (With a
    # 1-minute limit the USR2 warning can land before the task has installed its handler: FAILED, not TIMEOUT.)
    hang = "import signal, time; signal.signal(signal.SIGUSR2, signal.SIG_IGN); time.sleep(600)"
    args = sweep_args(
        tmp_path,
        "s-time",
        "policy.schedule.round0_size=1",
        "stage.budget.max_rounds=1",
        "policy.driver.max_attempts=1",
        "stage.gpus=8",
        "++cluster.poll_interval_s=2",
        "++cluster.min_time_min=2",
        "++cluster.time_margin_min=0",
        f"workload.command=[python,-c,'{hang}']",
        "workload.name=hang",
        cluster="slurm",
    )
    proc = cli("sweep", *args, "--plain", timeout=400)
    assert proc.returncode == 1, proc.stderr[-3000:] + proc.stdout[-3000:]  # nothing measured
    with Ledger.open(ledger_url(tmp_path)) as led:
        (c,) = led.candidates("s-time")
        (a,) = led.attempts(c.id)
        assert a.state == "TIMEOUT" and a.failure_class == "TIMEOUT" and c.status == "failed"


def test_slurm_oom_and_external_workload(tmp_path, slurm_cluster):
    oom = cli(
        "sweep",
        *sweep_args(
            tmp_path,
            "s-oom",
            "++workload.twin.force_oom=true",
            "policy.schedule.round0_size=2",
            "stage.budget.max_rounds=1",
            *NODE8,
            cluster="slurm",
        ),
        "--plain",
        timeout=400,
    )
    assert oom.returncode == 1, oom.stderr[-3000:]  # every job OOMed: nothing measured
    script = Path(__file__).resolve().parent.parent / "workloads" / "surface.py"
    ext = cli(
        "sweep",
        *sweep_args(
            tmp_path,
            "s-ext",
            f"workload.command=[python,{script}]",
            "workload.name=surface",
            "policy.schedule.round0_size=2",
            "stage.budget.max_rounds=1",
            *NODE8,
            "++workload.env={SURFACE_HBM_GB: '200'}",
            cluster="slurm",
        ),
        "--plain",
        timeout=400,
    )
    assert ext.returncode == 0, ext.stderr[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        for c in led.candidates("s-oom"):
            atts = led.attempts(c.id)
            assert c.status == "failed" and [a.failure_class for a in atts] == ["OOM"]
        measured = led.evidence.measured(sweep="s-ext")
        assert measured
        cand = next(c for c in led.candidates("s-ext") if c.id == measured[0].candidate_id)
        job = JobPaths(led.attempts(cand.id)[-1].job_dir)
    # One task per fake GPU: the evidence ranks keep rank files, the others' lines are in their node's log.
    evidence = evidence_ranks(cand.layout, 8)
    assert {JobPaths.rank_of(p) for p in job.folder.glob("rank-*.out")} == set(evidence)
    labelled = {int(line.split(":", 1)[0]) for p in job.node_logs() for line in p.read_text().splitlines()}
    assert labelled == set(range(8)) - evidence
    assert "synthetic surface workload" in "".join(p.read_text() for p in job.folder.glob("rank-*.out"))


def test_cancel_scancels_every_live_job(tmp_path, slurm_cluster):
    args = sweep_args(
        tmp_path,
        "s-stop",
        "policy.schedule.round0_size=2",
        "stage.budget.max_rounds=2",
        *NODE8,
        *SLOW,
        *LONG,
        cluster="slurm",
    )
    with running_sweep(args, log=tmp_path / "run.log") as run:
        run.attempts(2, timeout=180)
        proc = cli("cancel", "s-stop", f"ledger.url={ledger_url(tmp_path)}", timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert run.wait(120) == 1, run.output()[-2000:]  # cancelled before anything was measured
    with Ledger.open(ledger_url(tmp_path)) as led:
        ids = [a.job_id for a in all_attempts(led, "s-stop")]
        assert led.get_sweep("s-stop").status == "cancelled" and led.events("s-stop", kind="cancelled")
    # Every task, running or still pending: an array cancelled while pending is ONE accounting row (listed as
    # "123"), read here as the launcher's poll reads it, so the test does not race the scheduler.
    seen: dict = {}

    def cancelled() -> dict | None:
        seen.update(st=_sacct_states(ids))
        every = len(seen["st"]) == len(ids) and all(s == "CANCELLED" for s in seen["st"].values())
        return seen["st"] if every else None

    try:
        states = wait_for(cancelled, 120, "sacct to show CANCELLED")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: sacct {seen.get('st')}, ledger ids {ids}") from None
    assert set(states) == set(ids), (states, ids)


def _sacct_states(ids) -> dict[str, str]:
    """Each id's state as the launcher's poll reads it (sacct.state_for: a pending array cancelled whole is
    listed under its bare base id only)."""
    out = subprocess.run(sacct.command(ids), capture_output=True, text=True).stdout
    found = sacct.parse(out)
    return {j: st.state for j in ids if (st := sacct.state_for(found, j)) is not None}


def test_one_sacct_call_per_poll_for_the_whole_sweep(tmp_path, slurm_cluster):
    """In-process driver: the launcher's own counters against the loop's polls."""
    from orchestrator.config import compose
    from orchestrator.launch.slurm import SlurmLauncher
    from orchestrator.ledger.ledger import Ledger
    from orchestrator.sweep import Driver
    from orchestrator.sweep.view import View

    composed = compose(
        sweep_args(
            tmp_path, "s-count", "policy.schedule.round0_size=4", "stage.budget.max_rounds=1", *NODE8, cluster="slurm"
        )
    )
    cfg = composed.cfg
    launcher = SlurmLauncher(cfg.cluster)
    with Ledger.from_config(cfg.ledger, create=True) as led:
        sweep = led.create_or_get_sweep(
            "s-count",
            stage=cfg.stage.name,
            config_yaml=composed.to_yaml(),
            model=cfg.model.name,
            hardware=cfg.hardware.name,
            workload=cfg.workload.name,
            provenance={},
        )
        driver = Driver(led, cfg, sweep, launcher, View(live=False, stream=open(os.devnull, "w")))
        out = driver.run()
        assert out.spent.runs == 4 and len(led.evidence.measured(sweep="s-count")) == 4
    assert launcher.sbatch_calls == 1  # four candidates, one array
    assert driver.stats["polls"] >= 2 and launcher.sacct_calls == driver.stats["polls"]


def _expand(node_list: str) -> set:
    """Slurm's compressed node list ("n[1-2],n4") as a set of names, via scontrol."""
    out = subprocess.run(["scontrol", "show", "hostnames", node_list], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_each_array_task_records_the_node_it_ran_on(tmp_path, slurm_cluster):
    """Issue 22 item 5: sacct lists a starting array under its base id, with the node of the task whose raw id
    is the base; every task took that node and kept it (a NODE_FAIL retry then excluded the wrong node). One
    array of four one-node jobs: each attempt's node is its own task's, as sacct lists `<base>_<i>`."""
    args = sweep_args(
        tmp_path, "s-nodes", "policy.schedule.round0_size=4", "stage.budget.max_rounds=1", *NODE8, cluster="slurm"
    )
    proc = cli("sweep", *args, "--plain", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        atts = all_attempts(led, "s-nodes")
        assert len(atts) == 4 and len({str(a.job_id).split("_")[0] for a in atts}) == 1  # one array
        assert all(a.node_list for a in atts), [(a.job_id, a.node_list) for a in atts]
        assert not wrong_nodes(led, "s-nodes"), wrong_nodes(led, "s-nodes")
