"""LocalLauncher: real submitit local processes, polled from their job objects (no Slurm needed)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from orchestrator.core.schema import ClusterConfig, LocalConfig
from orchestrator.launch import LaunchError, LaunchTask, Submitted
from orchestrator.launch.auto import make_launcher
from orchestrator.launch.local import LocalLauncher

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def square_and_record(folder: str, x: int) -> int:
    """Stands for the jobs side: writes result.json into its folder, returns a value."""
    with open(os.path.join(folder, "result.json"), "w") as fh:
        env, cuda = os.environ.get("ORCH_TEST_ENV"), os.environ.get("CUDA_VISIBLE_DEVICES")
        json.dump({"x": x, "square": x * x, "env": env, "cuda": cuda}, fh)
    return x * x


def boom(folder: str) -> None:
    raise ValueError("deliberate failure")


def sleep_for(folder: str, seconds: float) -> None:
    time.sleep(seconds)


def deaf_sleep(folder: str, seconds: float) -> None:
    """A task that ignores SIGINT: only the controller's SIGKILL stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(seconds)


def run_until(folder: str, gate: str) -> None:
    """Runs until the test creates `gate` (an event, not a time), then returns."""
    deadline = time.monotonic() + 300
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _importable_tests(monkeypatch):
    """Jobs unpickle these test functions by module name, whatever the cwd."""
    monkeypatch.setenv("PYTHONPATH", REPO)


def local_cluster(**kw) -> ClusterConfig:
    env = {"ORCH_TEST_ENV": "from-cluster-env"}
    return ClusterConfig(kind="local", min_time_min=1, local=LocalConfig(max_workers=2), env=env, **kw)


def task(fn, folder, *args, time_min=1, token="") -> LaunchTask:
    return LaunchTask(
        fn=fn,
        args=(str(folder), *args),
        n_gpus=1,
        gpus_per_node=1,
        name="t",
        folder=str(folder),
        time_min=time_min,
        token=token,
    )


def is_local_job_id(jid: str) -> bool:
    """`pid:start`: the controller's pid and its start time in clock ticks since boot (orchestrator/core/proc.py)."""
    pid, _, start = jid.partition(":")
    return pid.isdigit() and start.isdigit()


def gone(ident: str) -> bool:
    """The process `pid:start` no longer runs: no such pid, a zombie (killed; its orphan waits for a reaper this
    container may not run), or another process that reuses the pid."""
    from orchestrator.core import proc

    return not proc.running(ident)


def started_task(folder) -> str:
    """The identity (`pid:start`) of the task that wrote `folder`'s start record, once it has written it."""
    from orchestrator.core.paths import JobPaths

    _wait_file(JobPaths(folder).started)
    return json.loads(JobPaths(folder).started.read_text())["task"]


def wait_terminal(launcher, ids, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = launcher.poll(ids)
        if all(s.terminal for s in states.values()):
            return states
        time.sleep(0.2)
    raise AssertionError(f"not terminal after {timeout_s}s: {states}")


@pytest.mark.long
def test_local_runs_function_and_returns_value(tmp_path):
    launcher, reason = make_launcher(local_cluster())
    assert isinstance(launcher, LocalLauncher) and launcher.kind == "local" and "local" in reason
    subs = launcher.submit([task(square_and_record, tmp_path / "a", 7), task(boom, tmp_path / "b")])
    assert [s.folder for s in subs] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert all(s.array_index is None and is_local_job_id(s.job_id) for s in subs)
    states = wait_terminal(launcher, [s.job_id for s in subs])
    ok, bad = states[subs[0].job_id], states[subs[1].job_id]
    assert (ok.state, ok.exit_code, ok.terminal) == ("COMPLETED", 0, True)
    assert ok.start is not None and ok.end is not None and ok.end >= ok.start
    assert bad.state == "FAILED" and bad.terminal
    assert launcher.result(subs[0].job_id) == 49
    with pytest.raises(Exception, match="deliberate failure"):
        launcher.result(subs[1].job_id)
    # The cluster's env reached the job; the job wrote its own result.json.
    assert json.loads((tmp_path / "a" / "result.json").read_text())["env"] == "from-cluster-env"


@pytest.mark.parametrize(("present", "visible"), [(0, ""), (1, "0"), (4, "0")])
def test_local_job_sees_the_machines_gpus(tmp_path, monkeypatch, present, visible):
    """A task asking for one GPU sees GPU 0 where the machine has one (the H200 device run's job saw none:
    CUDA_VISIBLE_DEVICES was empty), and none on a CPU box."""
    from orchestrator.launch.local import launcher as local

    monkeypatch.setattr(local, "local_gpus", lambda: present)
    launcher = LocalLauncher(local_cluster())
    (sub,) = launcher.submit([task(square_and_record, tmp_path, 3)])
    assert wait_terminal(launcher, [sub.job_id])[sub.job_id].state == "COMPLETED"
    assert json.loads((tmp_path / "result.json").read_text())["cuda"] == visible


def test_local_cancel_and_reattach(tmp_path):
    """A job cancelled while it runs (its start record: an event, not a time) is CANCELLED; after a restart,
    with only ids and folders, it reads FAILED (started, no exit marker of its own: lost, retried), never TIMEOUT:
    it never ran to its limit (no time-limit warning in its folder)."""
    from orchestrator.core.paths import JobPaths

    launcher = LocalLauncher(local_cluster())
    done, slow = launcher.submit(
        [task(square_and_record, tmp_path / "a", 3), task(sleep_for, tmp_path / "b", 300, token="sw.b")]
    )
    task_b = started_task(tmp_path / "b")
    launcher.cancel([slow.job_id])
    assert gone(task_b)
    assert not list((tmp_path / "b").glob(JobPaths.TIME_LIMIT_MARK.format(rank="*")))
    states = wait_terminal(launcher, [done.job_id, slow.job_id])
    assert states[slow.job_id].state == "CANCELLED"
    assert states[done.job_id].state == "COMPLETED"
    # A restarted orchestrator has only the stored ids and folders.
    fresh = LocalLauncher(local_cluster())
    fresh.attach([done, slow])
    again = fresh.poll([done.job_id, slow.job_id])
    assert again[done.job_id].state == "COMPLETED"
    assert again[slow.job_id].terminal and again[slow.job_id].state == "FAILED"
    assert fresh.result(done.job_id)["square"] == 9
    with pytest.raises(LaunchError, match="no result.json"):
        fresh.result(slow.job_id)
    with pytest.raises(LaunchError, match="attach"):
        LocalLauncher(local_cluster()).result(done.job_id)


@pytest.mark.long
def test_local_slots_limit_concurrency(tmp_path):
    """cluster.local.max_workers=1: the second job starts only after the first ended (their order, never a
    duration: each id reaches the caller as its job starts, and the first had ended when the second's came)."""
    launcher = LocalLauncher(local_cluster(), slot_poll_s=0.05)
    launcher.cluster.local.max_workers = 1
    seen: list[tuple[int, str, bool]] = []

    def on_submitted(pairs) -> None:  # is the first job still running when this id arrives?
        for i, sub in pairs:
            first = seen[0][1] if seen else sub.job_id
            seen.append((i, sub.job_id, not launcher.poll([first])[first].terminal))

    a, b = launcher.submit(
        [task(sleep_for, tmp_path / "a", 2.0), task(sleep_for, tmp_path / "b", 0.1)], on_submitted=on_submitted
    )
    assert [(i, jid) for i, jid, _ in seen] == [(0, a.job_id), (1, b.job_id)]
    assert seen[0][2] is True  # the first id came while its job ran (not when the whole round was out)
    assert seen[1][2] is False  # the second id came once the first job had ended: one slot
    states = wait_terminal(launcher, [a.job_id, b.job_id])
    assert states[a.job_id].end <= states[b.job_id].start


def test_attach_records_folders():
    launcher = LocalLauncher(local_cluster())
    launcher.attach([Submitted(job_id="999999999", array_index=None, folder="/nonexistent")])
    st = launcher.poll(["999999999"])["999999999"]
    assert st.terminal and "lost" in st.reason


def test_auto_falls_back_to_local(monkeypatch, tmp_path):
    from orchestrator.core.errors import UserError

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    launcher, reason = make_launcher(ClusterConfig(kind="auto"))
    assert isinstance(launcher, LocalLauncher) and reason == "no sbatch on PATH; using the local executor"
    with pytest.raises(UserError, match="cluster.kind=slurm but Slurm is not usable here"):
        make_launcher(ClusterConfig(kind="slurm"))
    with pytest.raises(UserError, match="unknown"):
        make_launcher(ClusterConfig(kind="pbs"))
    # A client that answers with no controller behind it (sinfo fails) is not a cluster.
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "sbatch").write_text("#!/bin/sh\necho slurm 22.05.8\n")
    (shims / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\nexit 1\n")
    for f in shims.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", str(shims))
    launcher, reason = make_launcher(ClusterConfig(kind="auto"))
    assert launcher.kind == "local" and "Unable to contact slurm controller" in reason


@pytest.mark.long
def test_a_hung_local_job_killed_at_its_time_limit_is_timeout_and_retried_once(tmp_path):
    """Killed at its limit with the warning mark in its folder: TIMEOUT as on Slurm, not CRASH ("exit code 1")."""
    from orchestrator.core.failures import retried_by_default
    from orchestrator.core.paths import JobPaths
    from orchestrator.evidence.classify import classify

    launcher = LocalLauncher(local_cluster(signal_delay_s=5))  # min_time_min=1: killed after 60 s
    (sub,) = launcher.submit([task(sleep_for, tmp_path / "hung", 600.0)])
    state = wait_terminal(launcher, [sub.job_id], timeout_s=300)[sub.job_id]
    assert list(tmp_path.joinpath("hung").glob(JobPaths.TIME_LIMIT_MARK.format(rank="*")))  # the warning came
    assert state.state == "TIMEOUT", state
    verdict = classify([], slurm_state=state.state, exit_code=state.exit_code)
    assert verdict.failure_class == "TIMEOUT" and retried_by_default(verdict.failure_class)
    fresh = LocalLauncher(local_cluster())  # after a restart only the folder is left: the mark still says so
    fresh.attach([sub])
    assert fresh.poll([sub.job_id])[sub.job_id].state == "TIMEOUT"


# ---- adoption after a kill -9 of the orchestrator (issue 22 item 2) ------------------------------------------


def _wait_file(path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_find_adopts_a_job_that_ended_before_its_launch_record(tmp_path):
    """Killed just after submitit's local submit returned (before launch.json, before the ledger's record):
    the job ran to its end as an orphan. A new orchestrator finds it by the job's own evidence (its start
    record and exit marker, submitit's folder), COMPLETED under its own id: adopted, never launched again."""
    from orchestrator.core.paths import JobPaths

    launcher = LocalLauncher(local_cluster())
    (sub,) = launcher.submit([task(square_and_record, tmp_path / "a", 5, token="sw.0001")])
    assert wait_terminal(launcher, [sub.job_id])[sub.job_id].state == "COMPLETED"
    paths = JobPaths(tmp_path / "a")
    paths.launch.unlink()  # what a kill between submit() and the record leaves: no launch.json
    paths.result.unlink()  # and no result.json: only the orchestrator writes that
    found = LocalLauncher(local_cluster()).find([("sw.0001", None, str(tmp_path / "a"))], since=None)  # type: ignore[arg-type]
    assert {k: (f.job_id, f.state) for k, f in found.items()} == {("sw.0001", None): (sub.job_id, "COMPLETED")}
    # another launch's token is not this folder's job
    assert not LocalLauncher(local_cluster()).find([("sw.other", None, str(tmp_path / "a"))], since=None)  # type: ignore[arg-type]


def test_find_adopts_a_running_job_without_launch_record_and_a_stray_result_is_no_verdict(tmp_path):
    """A job still running when its orchestrator died is RUNNING (adopted), and a stray result.json in its folder
    does not make the re-attached job COMPLETED: only the job's own exit decides (issue 22 item 4)."""
    from orchestrator.core.paths import JobPaths

    gate = str(tmp_path / "gate")
    launcher = LocalLauncher(local_cluster())
    (sub,) = launcher.submit([task(run_until, tmp_path / "a", gate, time_min=5, token="sw.0002")])
    paths = JobPaths(tmp_path / "a")
    _wait_file(paths.started)
    paths.launch.unlink()
    paths.result.write_text(json.dumps({"ok": True, "measure_iters": 3}))  # stray: nobody collected it
    fresh = LocalLauncher(local_cluster())
    found = fresh.find([("sw.0002", None, str(tmp_path / "a"))], since=None)  # type: ignore[arg-type]
    assert {k: (f.job_id, f.state) for k, f in found.items()} == {("sw.0002", None): (sub.job_id, "RUNNING")}
    fresh.attach([sub])
    assert fresh.poll([sub.job_id])[sub.job_id].state == "RUNNING"  # not COMPLETED by the stray file
    open(gate, "w").close()
    _wait_file(paths.exited)
    wait_terminal(launcher, [sub.job_id])
    st = fresh.poll([sub.job_id])[sub.job_id]
    assert (st.state, st.exit_code) == ("COMPLETED", 0)
    assert json.loads(paths.exited.read_text())["job_id"] == sub.job_id


def test_local_cancel_stops_the_tasks_quietly(tmp_path, capfd):
    """cancel() signals the job's tasks, not submitit's controller: the controller (it shares our terminal)
    then returns by itself, so no KeyboardInterrupt traceback of its reaches the user (`make run`'s early cut
    printed one), the job still ends CANCELLED, and the task's process is gone."""
    launcher = LocalLauncher(local_cluster())
    (sub,) = launcher.submit([task(sleep_for, tmp_path / "a", 300, token="tok")])
    task_a = started_task(tmp_path / "a")  # the task is running: an event, not a time
    launcher.cancel([sub.job_id])
    assert launcher._jobs[sub.job_id].done()  # stopped before cancel() returned: a caller may exit right after
    assert gone(task_a)
    assert launcher.poll([sub.job_id])[sub.job_id].state == "CANCELLED"
    err = capfd.readouterr().err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err


def test_local_cancel_falls_back_to_the_controller(tmp_path):
    """A task deaf to SIGINT past the grace (0 here) is stopped by submitit's controller (SIGINT, then SIGKILL
    to its tasks), and cancel() returns once the controller has exited: the job is done and CANCELLED."""
    launcher = LocalLauncher(local_cluster())
    launcher.CANCEL_GRACE_S = 0.0
    (sub,) = launcher.submit([task(deaf_sleep, tmp_path / "a", 300, token="tok")])
    task_a = started_task(tmp_path / "a")
    launcher.cancel([sub.job_id])
    assert launcher._jobs[sub.job_id].done()  # cancel() waited for the controller: the job ended before it returned
    assert launcher.poll([sub.job_id])[sub.job_id].state == "CANCELLED"
    assert gone(task_a)


def test_local_cancel_right_after_submit_stops_the_job(tmp_path):
    """A job cancelled as soon as submit() returned (its record failed: the caller then exits) may have no task
    yet: its controller is signalled before cancel() returns, and the job ends CANCELLED, its task never run or
    stopped."""
    launcher = LocalLauncher(local_cluster())
    (sub,) = launcher.submit([task(sleep_for, tmp_path / "a", 300, token="tok")])
    launcher.cancel([sub.job_id])
    assert wait_terminal(launcher, [sub.job_id])[sub.job_id].state == "CANCELLED"
    started = tmp_path / "a" / "job-started.json"
    assert not started.exists() or gone(json.loads(started.read_text())["task"])


# ---- a local job is its controller's pid and start time, never a bare pid (issue 45 item 8) ---------------------


@pytest.fixture
def stranger():
    """Another live process (a `sleep` of this test): what holds a recorded job's pid once pids have wrapped."""
    import subprocess

    other = subprocess.Popen(["sleep", "600"])
    try:
        yield other
    finally:
        other.kill()
        other.wait()


def _started_then_gone(folder, token: str, job_id: str) -> None:
    """A job folder whose job started (launch record and start record naming `job_id`), then vanished."""
    from orchestrator.core.paths import JobPaths

    paths = JobPaths(folder)
    paths.folder.mkdir(parents=True, exist_ok=True)
    for path in (paths.launch, paths.started):
        path.write_text(json.dumps({"token": token, "job_id": job_id}))


def test_a_job_id_is_the_controllers_pid_and_start_time(tmp_path):
    """submit() names a job `pid:start` (submitit's controller: its pid and start time), and the job's own
    records name it the same way, so a folder and the ledger agree on who the job is."""
    from orchestrator.core import proc
    from orchestrator.core.paths import JobPaths

    launcher = LocalLauncher(local_cluster())
    (sub,) = launcher.submit([task(square_and_record, tmp_path / "a", 2, token="sw.id")])
    pid, _, start = sub.job_id.partition(":")
    assert is_local_job_id(sub.job_id) and start == proc.start_time(int(pid)), sub.job_id
    assert wait_terminal(launcher, [sub.job_id])[sub.job_id].state == "COMPLETED"
    paths = JobPaths(tmp_path / "a")
    assert [json.loads(p.read_text())["job_id"] for p in (paths.launch, paths.started, paths.exited)] == [
        sub.job_id
    ] * 3


@pytest.mark.parametrize("form", ["bare pid (an older ledger)", "pid:start of another process"])
def test_a_reused_pid_is_never_reattached_adopted_or_cancelled(tmp_path, stranger, form):
    """A recorded job whose pid now belongs to another live process (pids wrapped during a long CI run, so a
    resumed job met a killed job's pid) reads as lost: never RUNNING when re-attached or adopted, and cancel()
    leaves the other process alone."""
    from orchestrator.core import proc

    start = proc.start_time(stranger.pid)
    jid = str(stranger.pid) if form.startswith("bare") else f"{stranger.pid}:{int(start) - 1}"
    folder = tmp_path / "gone"
    _started_then_gone(folder, "sw.gone", jid)

    found = LocalLauncher(local_cluster()).find([("sw.gone", None, str(folder))], since=None)  # type: ignore[arg-type]
    assert found[("sw.gone", None)].state == "FAILED"  # started, then vanished: adopted as lost, never RUNNING
    fresh = LocalLauncher(local_cluster())
    fresh.attach([Submitted(job_id=jid, array_index=None, folder=str(folder))])
    st = fresh.poll([jid])[jid]
    assert (st.state, st.terminal) == ("FAILED", True) and "lost" in st.reason, st
    fresh.cancel([jid])
    assert stranger.poll() is None and proc.running(f"{stranger.pid}:{start}")  # the other process lives on


def test_a_reattached_job_is_its_very_process_and_cancel_stops_it(tmp_path):
    """After a restart the job's own controller is re-attached (also by the bare pid an older ledger stored: its
    command line names the job's folder), and cancel() stops it; then it reads CANCELLED."""
    from orchestrator.core.paths import JobPaths

    first = LocalLauncher(local_cluster())
    (sub,) = first.submit([task(sleep_for, tmp_path / "a", 300, token="sw.re")])
    task_a = started_task(tmp_path / "a")
    bare = sub.job_id.partition(":")[0]
    JobPaths(tmp_path / "a").launch.write_text(json.dumps({"token": "sw.re", "job_id": bare}))  # an older record
    found = LocalLauncher(local_cluster()).find([("sw.re", None, str(tmp_path / "a"))], since=None)  # type: ignore[arg-type]
    assert (found[("sw.re", None)].job_id, found[("sw.re", None)].state) == (sub.job_id, "RUNNING")
    for jid in (bare, sub.job_id):
        fresh = LocalLauncher(local_cluster())
        fresh.attach([Submitted(job_id=jid, array_index=None, folder=str(tmp_path / "a"))])
        assert fresh.poll([jid])[jid].state == "RUNNING"
    fresh.cancel([sub.job_id])
    assert gone(task_a) and gone(sub.job_id)  # stopped before cancel() returned
    assert fresh.poll([sub.job_id])[sub.job_id].state == "CANCELLED"


def test_a_job_cancelled_by_a_process_that_ignores_sigint_stops(tmp_path):
    """An orchestrator started in the background by a script (`cmd &`: SIGINT ignored, and an ignored signal is
    inherited) still stops its jobs with cancel()'s SIGINT. Before, the job was deaf to it, ran to its time
    limit and, re-attached, read TIMEOUT (the CI failure of test_local_cancel_and_reattach)."""
    import signal as sig

    from orchestrator.core.paths import JobPaths

    before = sig.signal(sig.SIGINT, sig.SIG_IGN)
    try:
        launcher = LocalLauncher(local_cluster())
        (sub,) = launcher.submit([task(sleep_for, tmp_path / "a", 300, token="sw.ign")])
        assert sig.getsignal(sig.SIGINT) is sig.SIG_IGN  # this process still ignores it
        task_a = started_task(tmp_path / "a")
        launcher.cancel([sub.job_id])
    finally:
        sig.signal(sig.SIGINT, before)
    assert gone(task_a) and launcher.poll([sub.job_id])[sub.job_id].state == "CANCELLED"
    assert not list((tmp_path / "a").glob(JobPaths.TIME_LIMIT_MARK.format(rank="*")))  # never ran to its limit
    fresh = LocalLauncher(local_cluster())
    fresh.attach([sub])
    assert fresh.poll([sub.job_id])[sub.job_id].state == "FAILED"
