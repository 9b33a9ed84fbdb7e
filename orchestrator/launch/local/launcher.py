"""The local executor: submitit LocalExecutor, one process per job standing for all its ranks.

Why a slot limit: the laptop/CI box has few cores, so at most `cluster.local.max_workers` jobs run at
once; submit() waits for a free slot, so every job id it returns is a real, started process.

A job's id is its controller's `pid:start` (orchestrator/core/proc.py: the pid and the kernel's start time of
submitit's controller process), never a bare pid: pids wrap on a busy host, and a re-attached, adopted or
cancelled job must be the very process that was launched, never whatever holds its pid now.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from orchestrator.core import proc
from orchestrator.core.paths import JobPaths, atomic_write
from orchestrator.core.schema import ClusterConfig
from orchestrator.core.states import AttemptState
from orchestrator.launch.base import (
    Found,
    JobState,
    Launcher,
    LaunchError,
    LaunchTask,
    OnSubmitted,
    Submitted,
    mark_aborted,
    read_aborted,
    read_result,
    state_of,
)
from orchestrator.launch.task import RunInFolder

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _pid(jid: str) -> str:
    """The pid part of a local job id (submitit's name for the job: its `.submitit/<pid>/` folder)."""
    return jid.partition(":")[0]


def _same_job(a: object, b: str) -> bool:
    """Whether two local job ids name one job: the same pid and, where both carry one, the same start time
    (a job folder's markers of an older orchestrator name it by its bare pid)."""
    pa, pb = proc.parse(str(a)), proc.parse(b)
    return pa is not None and pb is not None and pa[0] == pb[0] and (not pa[1] or not pb[1] or pa[1] == pb[1])


def _own_controller(pid: int, folder: str | None) -> bool:
    """Whether the process at `pid` is submitit's local controller of this job folder (its command line names
    the folder's `.submitit`): how a bare pid (an older ledger's id, submitit's folder name) is told from a
    process that reuses it."""
    if not folder:
        return False
    mine = os.path.realpath(JobPaths(os.path.abspath(folder)).submitit_folder)
    args = proc.cmdline(pid)
    return "submitit.local._local" in args and any(os.path.realpath(a) == mine for a in args[1:])


def _alive(jid: str, folder: str | None) -> bool:
    """Whether job `jid`'s controller still runs: for `pid:start` that very process; for a bare pid only a
    process that is this folder's own controller. Anything else at that pid is another process: the job is
    gone (a zombie, killed and never reaped, is gone too)."""
    parsed = proc.parse(jid)
    if parsed is None:
        return False
    pid, start = parsed
    return proc.live(pid, start) if start else proc.live(pid) and _own_controller(pid, folder)


def _identified(jid: str, folder: str) -> str:
    """A bare pid upgraded to `pid:start` when its process is this folder's controller (then still running)."""
    parsed = proc.parse(jid)
    if parsed is None or parsed[1] or not _alive(jid, folder):
        return jid
    return proc.identity(parsed[0])


def _quiet_ignored(signum: int, frame: FrameType | None) -> None:
    """SIGINT's handler while a job is spawned from a process that ignores it (see _sigint_for_jobs)."""


@contextmanager
def _sigint_for_jobs() -> Iterator[None]:
    """Spawn jobs that take SIGINT, cancel()'s signal, even when this process ignores it.

    A process started in the background by a non-interactive shell (`cmd &` in a script, a CI runner) inherits
    SIGINT ignored, and an ignored signal stays ignored across fork and exec: its jobs were deaf to cancel() and
    ran to their time limit (a cancelled job then read TIMEOUT). A handler, unlike SIG_IGN, is reset to the
    default at exec, so for the spawn this process catches SIGINT and does nothing with it (it still ignores
    it), then goes back to SIG_IGN. Only the main thread may set a handler; elsewhere the jobs inherit it."""
    if (
        signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    signal.signal(signal.SIGINT, _quiet_ignored)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _read_json(path: Any) -> dict | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _submitit_job_ids(folder: str) -> list[str]:
    """Bare pids submitit started in this folder (its `.submitit/<pid>/` folders, newest first): the submitted
    pickle lands there before submit() returns, so a kill before launch.json still leaves the pid behind."""
    root = JobPaths(folder).folder / JobPaths.SUBMITIT
    try:
        dirs = [d for d in root.iterdir() if d.is_dir() and d.name.isdigit()]
    except OSError:
        return []
    return [d.name for d in sorted(dirs, key=lambda d: d.stat().st_mtime, reverse=True)]


def _task_ended(folder: str, job_id: str) -> bool:
    """submitit pickled the task's outcome (success or exception): the job ran to its end by itself."""
    from submitit.core.utils import JobPaths as SubmititPaths

    paths = SubmititPaths(JobPaths(os.path.abspath(folder)).submitit_folder, job_id=_pid(job_id))
    return paths.result_pickle.exists()


def _interrupt_tasks(jid: str) -> bool:
    """SIGINT each task of job `jid` (its controller's children, each pinned by its own identity); whether
    there was any to signal."""
    tasks = proc.children(int(_pid(jid))) if proc.running(jid) else []
    for task in tasks:
        proc.send(task, signal.SIGINT)
    return bool(tasks)


def local_gpus() -> int:
    """NVIDIA GPUs this machine shows (/dev/nvidiaN device nodes; 0 on a CPU box), read without CUDA."""
    names = os.listdir("/dev") if os.path.isdir("/dev") else []
    return sum(1 for n in names if n.startswith("nvidia") and n[6:].isdigit())


class LocalLauncher(Launcher):
    kind = "local"
    starts_on_submit = True
    CANCEL_GRACE_S = 10.0  # how long cancel() waits for tasks to end on their SIGINT before the controller's
    CONTROLLER_WAIT_S = 120.0  # a bound on waiting for a SIGINT'd controller (it SIGKILLs its tasks first)

    def __init__(self, cluster: ClusterConfig, slot_poll_s: float = 0.1) -> None:
        super().__init__()
        self.cluster = cluster
        self.slot_poll_s = slot_poll_s
        self._jobs: dict[str, Any] = {}  # job id -> submitit LocalJob
        self._timeout_s: dict[str, float] = {}
        self._start: dict[str, datetime] = {}
        self._end: dict[str, datetime] = {}
        self._cancelled: set[str] = set()

    def _running(self) -> int:
        running = 0
        for jid, job in self._jobs.items():
            if job.done():
                self._end.setdefault(jid, _now())  # first time seen ended: its end time
            else:
                running += 1
        return running

    def submit(self, tasks: list[LaunchTask], on_submitted: OnSubmitted | None = None) -> list[Submitted]:
        import submitit

        out = []
        for i, t in enumerate(tasks):
            while self._running() >= max(1, self.cluster.local.max_workers):
                time.sleep(self.slot_poll_s)
            time_min = max(self.cluster.min_time_min, int(t.time_min))
            executor = submitit.LocalExecutor(folder=JobPaths(os.path.abspath(t.folder)).submitit_folder)
            executor.update_parameters(
                timeout_min=time_min,
                nodes=1,
                tasks_per_node=1,
                # submitit sets CUDA_VISIBLE_DEVICES to the first gpus_per_node GPUs: 0 hid the GPU from a
                # real Megatron job on a GPU machine ("No CUDA GPUs are available", the H200 device run).
                gpus_per_node=min(int(t.gpus_per_node), local_gpus()),
                signal_delay_s=self.cluster.signal_delay_s,
            )
            # cluster.env is set inside the job, not by shell setup lines: without a shell in between,
            # cancel()'s SIGINT reaches submitit's controller, which stops the tasks.
            with _sigint_for_jobs():
                job = executor.submit(
                    RunInFolder(t.fn, t.args, t.folder, env=dict(self.cluster.env), token=t.token, launcher=self.kind)
                )
            jid = proc.identity(int(job.job_id))  # our child, not yet reaped: its pid is still its own
            self._jobs[jid], self._folders[jid] = job, t.folder
            self._timeout_s[jid], self._start[jid] = 60.0 * time_min, _now()
            if t.token:  # what `find` reads after a restart: no scheduler to ask, the folder answers
                atomic_write(JobPaths(t.folder).launch, json.dumps({"token": t.token, "job_id": jid}))
            out.append(Submitted(job_id=jid, array_index=None, folder=t.folder))
            if on_submitted is not None:
                try:
                    on_submitted([(i, out[-1])])
                except BaseException as exc:  # not recorded: stop it at once, its folder saying so first
                    mark_aborted(t, jid, exc)
                    self.cancel([jid])
                    raise
        return out

    def find(self, intents: list[tuple[str, int | None, str]], since: datetime) -> dict[tuple[str, int | None], Found]:
        """Adopt a launch from its folder's own evidence (a local job has no scheduler to ask): launch.json, the
        job's start record and exit marker (launch/task.RunInFolder) and submitit's per-job folder name the
        process, so a job killed with its orchestrator before launch.json was written is still found. RUNNING
        while its very controller runs (`pid:start`; a bare pid only while it is this folder's controller: a
        reused pid is another process); COMPLETED when it ended by itself (its exit marker, or submitit's pickled
        outcome); FAILED when it started and vanished (adopted: collecting it says LOST, and it is retried);
        CANCELLED when nothing ever ran there, or once it stopped after `submit` cancelled it unrecorded (its
        folder's abort mark). result.json is the orchestrator's, never evidence."""
        out: dict[tuple[str, int | None], Found] = {}
        for token, idx, folder in intents:
            paths = JobPaths(folder)
            recs = [r for r in (_read_json(paths.launch), _read_json(paths.started), _read_json(paths.exited)) if r]
            if any(r.get("token") != token for r in recs):
                continue  # another launch's folder
            ids = [str(r["job_id"]) for r in recs if r.get("job_id")] + _submitit_job_ids(folder)
            ids = [i for i in ids if proc.parse(i) is not None]
            if not ids:
                continue
            jid = _identified(next((i for i in ids if ":" in i), ids[0]), folder)
            state = (
                AttemptState.RUNNING
                if _alive(jid, folder)
                else AttemptState.CANCELLED  # submit cancelled it, unrecorded: however it ended, no verdict
                if read_aborted(folder, token) is not None
                else AttemptState.COMPLETED
                if paths.exited.exists() or _task_ended(folder, jid)
                else AttemptState.FAILED
                if paths.started.exists()
                else AttemptState.CANCELLED
            )
            out[(token, idx)] = Found(job_id=jid, state=state)
        return out

    def _state(self, jid: str) -> JobState:
        job = self._jobs.get(jid)
        if job is None:  # re-attached after a restart: only the folder and the pid are left
            return self._reattached_state(jid)
        times: dict[str, Any] = {"node_list": "localhost", "start": self._start.get(jid)}  # JobState fields
        if not job.done():
            return state_of(AttemptState.RUNNING, **times)
        end = self._end.setdefault(jid, _now())
        proc = getattr(job, "_process", None)
        code = proc.returncode if proc is not None else None
        times.update(end=end, exit_code=code)
        if jid in self._cancelled:
            return state_of(AttemptState.CANCELLED, reason="cancelled", **times)
        timed_out = (end - self._start[jid]).total_seconds() >= self._timeout_s[jid]
        if job.paths.result_pickle.exists():
            import submitit

            outcome, _ = submitit.core.utils.pickle_load(job.paths.result_pickle)
            folder = self._folders.get(jid)
            if outcome != "success" and (timed_out or (folder is not None and _time_limit_warned(folder))):
                # killed at its limit (submitit's SIGINT pickles the KeyboardInterrupt): TIMEOUT, as on Slurm
                return state_of(AttemptState.TIMEOUT, reason="local time limit", **times)
            if outcome != "success" and not code:
                # submitit's controller exits 0 after pickling the task's exception: the task failed.
                times["exit_code"] = 1
            return state_of(AttemptState.COMPLETED if outcome == "success" else AttemptState.FAILED, **times)
        if timed_out:
            return state_of(AttemptState.TIMEOUT, reason="local time limit", **times)
        return state_of(AttemptState.FAILED, reason=f"no result (exit code {code})", **times)

    def _reattached_state(self, jid: str) -> JobState:
        """A job of an earlier orchestrator: its very process, else its own exit evidence. A process that holds
        its pid now is not the job (its id's start time, or for an older ledger's bare pid the controller's
        command line, says so): such a job is gone. A result.json proves nothing (the orchestrator writes it,
        and a stray one sat in a job's folder while the job ran on)."""
        folder = self._folders.get(jid)
        if _alive(jid, folder):
            return state_of(AttemptState.RUNNING, node_list="localhost")
        if jid in self._cancelled:
            return state_of(AttemptState.CANCELLED, reason="cancelled", node_list="localhost")
        exited = _read_json(JobPaths(folder).exited) if folder else None
        own = bool(exited and _same_job(exited.get("job_id"), jid))
        ok = bool(own and exited and exited.get("outcome") == "ok")
        if not ok and folder and _time_limit_warned(folder):  # killed at its limit: TIMEOUT, as on Slurm
            return state_of(AttemptState.TIMEOUT, reason="local time limit (its warning mark)", node_list="localhost")
        if own:
            return state_of(
                AttemptState.COMPLETED if ok else AttemptState.FAILED, node_list="localhost", exit_code=0 if ok else 1
            )
        if folder and _task_ended(folder, jid):
            return state_of(AttemptState.COMPLETED, node_list="localhost")
        return state_of(AttemptState.FAILED, reason="local job lost (no process, no exit marker of its own)")

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        return {str(j): self._state(str(j)) for j in job_ids}

    def cancel(self, job_ids: list[str]) -> None:
        """Each job is stopped, or its controller told to stop, before this returns (a caller about to exit, e.g.
        after a failed record, relies on it). SIGINT to each job's task (a workload gets it forwarded: job/entry),
        so submitit's controller sees it end and returns by itself. SIGINT to the controller (submitit's
        `LocalJob.cancel`) stops the task too, but its KeyboardInterrupt traceback lands on the user's terminal,
        which the controller shares (`make run`'s early cut printed one): that is the fallback, for a controller
        that has not started its task yet and for a task still up `CANCEL_GRACE_S` later (the controller then
        SIGKILLs it); cancel() then waits for the controller to exit, so the job is done() when it returns.
        A re-attached job (an earlier orchestrator's) is stopped the same way, only while its very controller
        runs: every signal goes to a process pinned by its `pid:start`, never to whatever reuses a pid."""
        ids = list(dict.fromkeys(map(str, job_ids)))
        live = {jid: jid for jid in ids if jid in self._jobs and not self._jobs[jid].done()}
        # a re-attached job by the identity of its controller (an older ledger's bare pid: the folder's own)
        pinned = {jid: _identified(jid, self._folders.get(jid, "")) for jid in ids if jid not in self._jobs}
        live.update({jid: pin for jid, pin in pinned.items() if proc.running(pin)})
        self._cancelled.update(live)
        quiet = [jid for jid, pin in live.items() if _interrupt_tasks(pin)]
        deadline = time.monotonic() + self.CANCEL_GRACE_S
        for jid in quiet:
            while not self._ended(jid, live[jid]) and time.monotonic() < deadline:
                time.sleep(self.slot_poll_s)
        fallback = [jid for jid in live if not self._ended(jid, live[jid])]
        for jid in fallback:
            if jid in self._jobs:
                self._jobs[jid].cancel()
            else:
                proc.send(live[jid], signal.SIGINT)
        for jid in fallback:  # the controller ends once its tasks are gone: wait for that event, not a time
            child = getattr(self._jobs.get(jid), "_process", None)
            wait_until = time.monotonic() + self.CONTROLLER_WAIT_S
            try:
                if child is not None:
                    child.wait(timeout=self.CONTROLLER_WAIT_S)
                else:  # not our child: nothing to wait() on, its identity tells when it is gone
                    while proc.running(live[jid]):
                        if time.monotonic() >= wait_until:
                            raise subprocess.TimeoutExpired(jid, self.CONTROLLER_WAIT_S)
                        time.sleep(self.slot_poll_s)
            except subprocess.TimeoutExpired:
                log.warning("local job %s: controller still up %.0f s after SIGINT", jid, self.CONTROLLER_WAIT_S)

    def _ended(self, jid: str, pin: str) -> bool:
        job = self._jobs.get(jid)
        return job.done() if job is not None else not proc.running(pin)

    def result(self, job_id: str) -> Any:
        job = self._jobs.get(str(job_id))
        if job is None:
            folder = self._folders.get(str(job_id))
            if folder is None:
                raise LaunchError(f"local job {job_id}: unknown (after a restart, call attach())")
            return read_result(folder)
        return job.result()


def _time_limit_warned(folder: str) -> bool:
    """Whether a rank of the job got the time-limit warning (orchestrator.launch.task records it)."""
    return any(Path(folder).glob(JobPaths.TIME_LIMIT_MARK.format(rank="*")))
