"""The local executor: submitit LocalExecutor, one process per job standing for all its ranks.

Why a slot limit: the laptop/CI box has few cores, so at most `cluster.local.max_workers` jobs run at
once; submit() waits for a free slot, so every job id it returns is a real, started process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    read_result,
    state_of,
)
from orchestrator.launch.task import RunInFolder

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _pid_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True


def _read_json(path: Any) -> dict | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _submitit_job_ids(folder: str) -> list[str]:
    """Job ids submitit started in this folder (its `.submitit/<pid>/` folders, newest first): the submitted
    pickle lands there before submit() returns, so a kill before launch.json still leaves the id behind."""
    root = JobPaths(folder).folder / JobPaths.SUBMITIT
    try:
        dirs = [d for d in root.iterdir() if d.is_dir() and d.name.isdigit()]
    except OSError:
        return []
    return [d.name for d in sorted(dirs, key=lambda d: d.stat().st_mtime, reverse=True)]


def _task_ended(folder: str, job_id: str) -> bool:
    """submitit pickled the task's outcome (success or exception): the job ran to its end by itself."""
    from submitit.core.utils import JobPaths as SubmititPaths

    return SubmititPaths(JobPaths(os.path.abspath(folder)).submitit_folder, job_id=job_id).result_pickle.exists()


def _child_pids(pid: str) -> list[int]:
    """The processes `pid` started (Linux /proc: every thread's `children` list); [] where none, or no /proc."""
    out: list[int] = []
    try:
        for thread in Path(f"/proc/{int(pid)}/task").iterdir():
            out += [int(c) for c in (thread / "children").read_text().split()]
    except (OSError, ValueError):
        return []
    return out


def _interrupt(pids: list[int]) -> bool:
    """SIGINT each of `pids`; whether there was any to signal."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGINT)
        except OSError:
            pass  # ended meanwhile
    return bool(pids)


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
            job = executor.submit(
                RunInFolder(t.fn, t.args, t.folder, env=dict(self.cluster.env), token=t.token, launcher=self.kind)
            )
            jid = str(job.job_id)
            self._jobs[jid], self._folders[jid] = job, t.folder
            self._timeout_s[jid], self._start[jid] = 60.0 * time_min, _now()
            if t.token:  # what `find` reads after a restart: no scheduler to ask, the folder answers
                atomic_write(JobPaths(t.folder).launch, json.dumps({"token": t.token, "job_id": jid}))
            out.append(Submitted(job_id=jid, array_index=None, folder=t.folder))
            if on_submitted is not None:
                try:
                    on_submitted([(i, out[-1])])
                except BaseException:  # not recorded: stop it at once
                    self.cancel([jid])
                    raise
        return out

    def find(self, intents: list[tuple[str, int | None, str]], since: datetime) -> dict[tuple[str, int | None], Found]:
        """Adopt a launch from its folder's own evidence (a local job has no scheduler to ask): launch.json, the
        job's start record and exit marker (launch/task.RunInFolder) and submitit's per-job folder name the
        process, so a job killed with its orchestrator before launch.json was written is still found. RUNNING
        while its process lives; COMPLETED when it ended by itself (its exit marker, or submitit's pickled
        outcome); FAILED when it started and vanished (adopted: collecting it says LOST, and it is retried);
        CANCELLED when nothing ever ran there. result.json is the orchestrator's, never evidence."""
        out: dict[tuple[str, int | None], Found] = {}
        for token, idx, folder in intents:
            paths = JobPaths(folder)
            recs = [r for r in (_read_json(paths.launch), _read_json(paths.started), _read_json(paths.exited)) if r]
            if any(r.get("token") != token for r in recs):
                continue  # another launch's folder
            ids = [str(r["job_id"]) for r in recs if r.get("job_id")] + _submitit_job_ids(folder)
            if not ids:
                continue
            jid = ids[0]
            state = (
                AttemptState.RUNNING
                if _pid_alive(jid)
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
        """A job of an earlier orchestrator: its process, else its own exit evidence. A result.json proves
        nothing (the orchestrator writes it, and a stray one sat in a job's folder while the job ran on)."""
        if _pid_alive(jid):
            return state_of(AttemptState.RUNNING, node_list="localhost")
        folder = self._folders.get(jid)
        exited = _read_json(JobPaths(folder).exited) if folder else None
        ok = bool(exited and str(exited.get("job_id")) == jid and exited.get("outcome") == "ok")
        if not ok and folder and _time_limit_warned(folder):  # killed at its limit: TIMEOUT, as on Slurm
            return state_of(AttemptState.TIMEOUT, reason="local time limit (its warning mark)", node_list="localhost")
        if exited and str(exited.get("job_id")) == jid:
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
        SIGKILLs it); cancel() then waits for the controller to exit, so the job is done() when it returns."""
        live = [jid for jid in map(str, job_ids) if jid in self._jobs and not self._jobs[jid].done()]
        self._cancelled.update(live)
        quiet = [jid for jid in live if _interrupt(_child_pids(jid))]
        deadline = time.monotonic() + self.CANCEL_GRACE_S
        for jid in quiet:
            while not self._jobs[jid].done() and time.monotonic() < deadline:
                time.sleep(self.slot_poll_s)
        fallback = [jid for jid in live if not self._jobs[jid].done()]
        for jid in fallback:
            self._jobs[jid].cancel()
        for jid in fallback:  # the controller ends once its tasks are gone: wait for that event, not a time
            proc = getattr(self._jobs[jid], "_process", None)
            if proc is not None:
                try:
                    proc.wait(timeout=self.CONTROLLER_WAIT_S)
                except subprocess.TimeoutExpired:
                    log.warning("local job %s: controller still up %.0f s after SIGINT", jid, self.CONTROLLER_WAIT_S)

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
