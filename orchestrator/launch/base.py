"""What every launcher hands the sweep loop: submitted job ids, job states, results.

Why a thin layer over submitit: the loop must survive a restart (kill -9) with nothing but the job ids
and folders it stored in the ledger, so states come from ids alone (sacct on Slurm) and results from
files the jobs write into their folder (`result.json`), never from in-memory submitit objects.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from orchestrator.core.paths import JobPaths, atomic_write
from orchestrator.core.spec import ALONE_INDEX_ENV as ALONE_INDEX_ENV
from orchestrator.core.states import AttemptState

# Called once per submission (a Slurm array, a local job) with (index into the tasks, Submitted) pairs.
OnSubmitted = Callable[[list[tuple[int, "Submitted"]]], None]


class LaunchError(RuntimeError):
    """A submission or a result read failed; the message says which job and why."""


class Unrunnable(LaunchError):
    """A job the cluster can never run (bigger than its partition, a pending reason that never clears): one
    line naming the limit and the fix, and nothing of it left queued."""

    user_facing = True


@dataclass
class LaunchTask:
    """One candidate attempt: `fn(*args)` runs once per rank (one task per GPU) in `folder`."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    n_gpus: int
    gpus_per_node: int
    name: str
    folder: str  # this attempt's job folder; the job writes result.json and rank logs here
    time_min: int  # wall limit the caller computed (windows + margin)
    exclude: str = ""  # Slurm node list to avoid (a NODE_FAIL retry keeps off the node that failed)
    token: str = ""  # launch intent (the ledger's launch_token): the Slurm job name, so `find` can ask for it
    # A one-GPU rank probe of k ranks: k separate tasks of n_gpus each (array tasks on Slurm, packed on shared
    # nodes), task i with core.spec ALONE_INDEX_ENV=i; its Submitted names them all ("123_[4-6]"). 1 = one job.
    alone: int = 1


def mark_aborted(task: LaunchTask, job_id: str, why: BaseException) -> None:
    """Write the launch's abort mark (JobPaths.ABORTED) before `submit` cancels a submission its caller could
    not record: however its job then ends (a SIGINT mid-run reads as a crash), the folder says it was the
    sweep's own cancel. Best effort: the cancel goes out even when the folder cannot be written."""
    body = {"token": task.token, "job_id": job_id, "why": f"{type(why).__name__}: {why}"[:300]}
    try:
        atomic_write(JobPaths(task.folder).aborted, json.dumps(body))
    except OSError:
        pass


def read_aborted(folder: str, token: str) -> dict[str, Any] | None:
    """The abort mark of this launch (its token) in `folder`, or None: a launch aborted so is no verdict on
    its layout (collect: LOST, retried; find: CANCELLED once it stopped; ingest: skipped)."""
    try:
        mark = json.loads(JobPaths(folder).aborted.read_text())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and mark.get("token") == token else None


def merged(states: list[JobState]) -> JobState:
    """One attempt's state from its tasks' (a rank probe's one-GPU array tasks): live while any task is live
    (running once one runs), else the first task that did not complete (its exit code and signal), else the
    first; nodes joined, the earliest start and the latest end."""
    live = [s for s in states if not s.terminal]
    if live:
        pick = next((s for s in live if s.state == AttemptState.RUNNING), live[0])
    else:
        pick = next((s for s in states if s.state != AttemptState.COMPLETED), states[0])
    nodes = ",".join(dict.fromkeys(s.node_list for s in states if s.node_list)) or None
    starts = [s.start for s in states if s.start]
    ends = [s.end for s in states if s.end]
    return replace(
        pick,
        node_list=nodes,
        start=min(starts) if starts else None,
        end=max(ends) if ends and not live else None,
    )


@dataclass
class Found:
    """A job the cluster knows by a launch token (see Launcher.find)."""

    job_id: str
    state: AttemptState


@dataclass
class Submitted:
    job_id: str  # "123" or, inside an array, "123_4"
    array_index: int | None
    folder: str


@dataclass
class JobState:
    state: AttemptState
    exit_code: int | None = None
    node_list: str | None = None
    start: datetime | None = None  # timezone-aware
    end: datetime | None = None
    reason: str | None = None
    terminal: bool = False
    signal: int | None = None  # the signal part of Slurm's "code:signal"
    previous: tuple[AttemptState, ...] = ()  # earlier runs of this job id (Slurm requeued it: NODE_FAIL, ...)


def state_of(state: str | AttemptState, **kw: Any) -> JobState:
    """A JobState whose `terminal` follows from the state (sacct's word, "CANCELLED by 0" included).

    PREEMPTED is final: jobs go out with --no-requeue (launch/slurm/launcher.py), so a preempted job never comes back
    under its id and the sweep retries it. REQUEUED is not (an admin's `scontrol requeue` of an older job).
    A word this code does not know is UNKNOWN (live), the word kept in `reason`."""
    word = AttemptState.parse(state)
    raw = str(state or "").strip()
    if word is AttemptState.UNKNOWN and raw not in ("", AttemptState.UNKNOWN) and not kw.get("reason"):
        kw["reason"] = f"sacct state {raw!r}"
    return JobState(state=word, terminal=word.terminal, **kw)


def shape(task: LaunchTask) -> tuple[int, int, int]:
    """(nodes, tasks_per_node, gpus_per_node): one task per GPU, whole nodes beyond one node."""
    if task.n_gpus <= 0:
        return 1, 1, 0
    per_node = task.gpus_per_node if task.gpus_per_node > 0 else task.n_gpus
    if task.n_gpus <= per_node:
        return 1, task.n_gpus, task.n_gpus
    if task.n_gpus % per_node:
        raise LaunchError(f"{task.name}: N={task.n_gpus} GPUs is not a multiple of {per_node} GPUs per node")
    return task.n_gpus // per_node, per_node, per_node


def read_result(folder: str) -> Any:
    """The job's own result file (written by the jobs side), parsed."""
    path = JobPaths(folder).result
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise LaunchError(f"no {path.name} in {folder}: the job did not finish its work") from None


class Launcher(ABC):
    """Submit a round, poll it with one call, cancel, read results."""

    kind: str = ""
    # True when a job runs from submit() on and submit() may block (the local executor waits for a free
    # slot): the loop then polls as each job goes out, so the ledger shows running jobs as running.
    starts_on_submit: bool = False

    def __init__(self) -> None:
        self._folders: dict[str, str] = {}

    def check_fits(self, tasks: list[LaunchTask]) -> None:
        """Raise Unrunnable when a task can never run on this cluster (before anything is submitted or written).
        The local executor runs what it is given."""
        return None

    def attach(self, submitted: Iterable[Submitted]) -> None:
        """Re-attach after a restart: remember where stored job ids keep their files."""
        for s in submitted:
            self._folders[str(s.job_id)] = s.folder

    def arrays(self, tasks: list[LaunchTask]) -> list[list[int]]:
        """How `submit` splits `tasks` into submissions (indexes into `tasks`), so the caller can give each
        one a token before anything is submitted. The tasks of a submission of several take consecutive array
        indexes in order, `alone` of them each (`array_indexes`)."""
        return [[i] for i in range(len(tasks))]

    @staticmethod
    def array_indexes(tasks: list[LaunchTask], group: list[int]) -> list[int | None]:
        """The first array index of each task of one submission (`arrays`'s group): None for a lone job."""
        if len(group) == 1 and tasks[group[0]].alone <= 1:
            return [None]
        out: list[int | None] = []
        k = 0
        for i in group:
            out.append(k)
            k += max(1, tasks[i].alone)
        return out

    @abstractmethod
    def find(self, intents: list[tuple[str, int | None, str]], since: datetime) -> dict[tuple[str, int | None], Found]:
        """The jobs the cluster knows for launch intents (token, array index, folder) written after `since`,
        keyed by (token, array index); an intent absent from the answer never reached the cluster.
        LaunchError when the cluster cannot answer (then nothing may be concluded)."""

    @abstractmethod
    def submit(self, tasks: list[LaunchTask], on_submitted: OnSubmitted | None = None) -> list[Submitted]:
        """Submit; `on_submitted([(index, submitted), ...])` is called once per submission (an array) as soon
        as its job ids are known, so the caller stores them (all or none) before the rest goes out. When it
        raises, that submission is cancelled at once, every task of it (no job runs that the caller could not
        record; earlier, recorded ones run on), nothing more is submitted, and the error goes up."""

    @abstractmethod
    def poll(self, job_ids: list[str]) -> dict[str, JobState]: ...

    @abstractmethod
    def cancel(self, job_ids: list[str]) -> None: ...

    @abstractmethod
    def result(self, job_id: str) -> Any: ...
