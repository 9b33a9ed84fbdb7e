"""Slurm through submitit: a round goes out as job arrays, one sacct call polls everything.

Why arrays: one sbatch per chunk of `cluster.slurm.max_array_size` tasks (not one per candidate) keeps the
controller load flat; `cluster.slurm.array_parallelism` caps how many run at once. Tasks that need a
different shape (nodes x tasks_per_node x GPUs) cannot share an array, so they are grouped first.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from os.path import commonpath
from typing import Any

from orchestrator.core.paths import JobPaths
from orchestrator.core.schema import ClusterConfig
from orchestrator.core.states import AttemptState
from orchestrator.launch.base import (
    ALONE_INDEX_ENV,
    Found,
    JobState,
    Launcher,
    LaunchError,
    LaunchTask,
    OnSubmitted,
    Submitted,
    Unrunnable,
    mark_aborted,
    merged,
    read_result,
    shape,
)
from orchestrator.launch.slurm import container, partition, sacct
from orchestrator.launch.slurm import intents as intents_mod
from orchestrator.launch.task import RunInFolder

REQUEUE_KEYS = ("requeue", "no_requeue")  # sbatch_extra may not hand the requeue decision back to Slurm


def env_setup(cluster: ClusterConfig) -> list[str]:
    """Shell lines run before the tasks start: the cluster's setup, then its environment variables."""
    return list(cluster.slurm.setup) + [f"export {k}={shlex.quote(str(v))}" for k, v in cluster.env.items()]


def node_log_flags(folder: str, array: bool) -> list[str]:
    """srun options that put submitit's task logs in one file per node (`%N`), each line labelled with its
    task rank (`--label`, which orchestrator.evidence.parse reads), instead of two files per task: srun keeps the last
    `--output`/`--error` it is given, so these follow submitit's own per-task ones."""
    from submitit.core.utils import JobPaths as SubmititPaths

    paths = SubmititPaths(folder=folder)
    out, err = (str(p).replace("%t", "%N") for p in (paths.stdout, paths.stderr))
    if array:  # as submitit names an array's logs
        out, err = out.replace("%j", "%A_%a"), err.replace("%j", "%A_%a")
    return ["--label", "--output", out, "--error", err]


def shares_a_node(task: LaunchTask) -> bool:
    """A task of fewer GPUs than a node holds (a one-GPU rank probe) shares its node: never `--exclusive` and
    never all of the node's memory, so Slurm packs up to `gpus_per_node` of them on one node."""
    return 0 < task.n_gpus < task.gpus_per_node


def mem_share(mem: str, gpus_per_node: int, node_mem_mb: Callable[[], int | None]) -> str | None:
    """A shared task's `--mem`: its GPUs' share of the per-node `mem` ("1800G" on 8 GPUs: "225G"); for "0" (all
    of a node's memory) the share of the partition's node memory (`node_mem_mb`), or no `--mem` when Slurm does
    not say it (Slurm's own per-CPU default)."""
    per = max(1, int(gpus_per_node))
    m = re.fullmatch(r"(\d+)([KMGT]?)", mem.strip().upper())
    if m is None:
        return mem
    value, unit = int(m.group(1)), m.group(2) or "M"
    if value == 0:
        total = node_mem_mb()
        return f"{total // per}M" if total else None
    mb = value * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    return f"{max(1, int(mb // per))}M"


def array_size(tasks: list[LaunchTask]) -> int:
    """Array tasks these LaunchTasks become: one each, a rank probe's `alone` tasks each."""
    return sum(max(1, t.alone) for t in tasks)


def span(ids: list[str]) -> str:
    """One attempt's consecutive array tasks in Slurm's notation: ["123_4", "123_5", "123_6"] -> "123_[4-6]"
    (what scancel takes, and sacct.expand_job_id reads back)."""
    base, first, last = ids[0].split("_")[0], ids[0].split("_")[1], ids[-1].split("_")[1]
    return f"{base}_[{first}-{last}]"


def _array_name(tasks: list[LaunchTask]) -> str:
    if len(tasks) == 1:
        return tasks[0].name
    prefix = commonpath([t.name for t in tasks]).rstrip(":-_ ")
    return f"{prefix or 'orch'}[{len(tasks)}]"


class SlurmLauncher(Launcher):
    """Counters (`sbatch_calls`, `sacct_calls`, `scancel_calls`) let tests and benchmarks prove the
    control-plane cost: one sbatch per array chunk, one sacct per poll, one scancel per cancel."""

    kind = "slurm"

    def __init__(self, cluster: ClusterConfig) -> None:
        super().__init__()
        container.check(cluster)
        self.cluster = cluster
        self.sbatch_calls = 0
        self.sacct_calls = 0
        self.scancel_calls = 0
        self._partition: partition.Partition | None = None  # read once, at the first check (partition.read)

    # -- submit ---------------------------------------------------------------------------------------
    def parameters(self, tasks: list[LaunchTask], folder: str | None = None) -> dict[str, Any]:
        """submitit SlurmExecutor parameters for one array of same-shape tasks (`folder`: submitit's,
        for the per-node task logs)."""
        c, s = self.cluster, self.cluster.slurm
        nodes, per_node, gpus = shape(tasks[0])
        params: dict[str, Any] = {
            "job_name": tasks[0].token or _array_name(tasks),  # a token names the launch intent (find)
            # One limit per array: the longest the caller asked for, never under the cluster minimum.
            "time": max(c.min_time_min, *(int(t.time_min) for t in tasks)),
            "nodes": nodes,
            "ntasks_per_node": per_node,
            "signal_delay_s": c.signal_delay_s,
            "array_parallelism": s.array_parallelism,
            "setup": container.setup_lines(c) + env_setup(c),
        }
        if gpus:
            params["gpus_per_node"] = gpus
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(s, key):
                params[key] = getattr(s, key)
        shared = shares_a_node(tasks[0])
        if c.exclusive and not shared:
            params["exclusive"] = True
        if c.cpus_per_task:
            params["cpus_per_task"] = int(c.cpus_per_task)
        if c.mem is not None:
            mem = mem_share(str(c.mem), tasks[0].gpus_per_node, self._node_mem_mb) if shared else str(c.mem)
            if mem:
                params["mem"] = mem  # "0": all of each node's memory
        if tasks[0].exclude:
            params["exclude"] = tasks[0].exclude
        # The orchestrator owns every rerun: Slurm never requeues a job (a NODE_FAIL requeue would rerun the
        # task under the same id into the same folder while the loop retries it too). sbatch(1) --no-requeue;
        # submitit writes `#SBATCH --<key>` for a True value (submitit/slurm/slurm.py: _as_sbatch_flag).
        extra = {k: v for k, v in s.sbatch_extra.items() if k.replace("-", "_") not in REQUEUE_KEYS}
        params["additional_parameters"] = {**extra, "no_requeue": True}
        logs = node_log_flags(folder, array_size(tasks) > 1) if folder else []
        srun = container.srun_flags(c) + logs + list(s.srun_args)
        if srun:
            params["srun_args"] = srun
        return params

    def _node_mem_mb(self) -> int | None:
        """The partition's smallest node memory in MB (`sinfo %m`), read once; None when Slurm does not say."""
        part = self.target()
        return part.mem_mb if part is not None else None

    def executor_folder(self, tasks: list[LaunchTask]) -> str:
        """submitit's own folder (sbatch script, pickles, logs), next to the tasks' job folders: flat, and
        created before sbatch (JobPaths.submitit_flat_folder says why)."""
        return JobPaths(os.path.commonpath([os.path.abspath(t.folder) for t in tasks])).submitit_flat_folder

    def submit_command(self, folder: str) -> str:
        """What submitit's srun line runs on every task: `<python> -u -m submitit.core._submit <folder>`, with
        cluster.slurm.python (the container's interpreter) when set."""
        python = container.python(self.cluster) or shlex.quote(sys.executable)
        return " ".join([python, "-u -m submitit.core._submit", shlex.quote(folder)])

    def batch_script(self, tasks: list[LaunchTask]) -> str:
        """The batch script submitit writes for these tasks (one job, or an array for several), without
        calling sbatch: its own template with this launcher's parameters and command."""
        from submitit.slurm.slurm import _make_sbatch_string

        folder = self.executor_folder(tasks)
        params = self.parameters(tasks, folder)
        if array_size(tasks) > 1:
            params["map_count"] = array_size(tasks)
        return _make_sbatch_string(command=self.submit_command(folder), folder=folder, **params)

    def arrays(self, tasks: list[LaunchTask]) -> list[list[int]]:
        """One array per (shape, excluded nodes), in chunks of `cluster.slurm.max_array_size` array tasks (a rank
        probe's `alone` tasks never split over two): sbatch options hold for a whole array."""
        groups: dict[tuple[tuple[int, int, int], str], list[int]] = defaultdict(list)
        for i, t in enumerate(tasks):
            groups[(shape(t), t.exclude)].append(i)
        size = max(1, int(self.cluster.slurm.max_array_size))
        out: list[list[int]] = []
        for idxs in groups.values():
            chunk: list[int] = []
            for i in idxs:
                if chunk and array_size([tasks[j] for j in chunk]) + max(1, tasks[i].alone) > size:
                    out.append(chunk)
                    chunk = []
                chunk.append(i)
            out.append(chunk)
        return out

    def target(self) -> partition.Partition | None:
        """The partition jobs go to (cluster.slurm.partition, else Slurm's default); None when Slurm is silent."""
        if self._partition is None:
            self._partition = partition.read(self.cluster.slurm.partition)
        return self._partition

    def requests(self, tasks: list[LaunchTask]) -> list[partition.Request]:
        """What each array of `tasks` asks of a node, as sbatch will be told (`parameters`)."""
        out = []
        for chunk in self.arrays(tasks):
            group = [tasks[i] for i in chunk]
            p = self.parameters(group)
            names = sorted({t.name.split(":", 1)[0] for t in group})
            out.append(
                partition.Request(
                    what=f"{', '.join(names)} job(s)",
                    nodes=int(p["nodes"]),
                    cpus_per_node=int(p.get("cpus_per_task") or 1) * int(p["ntasks_per_node"]),
                    gpus_per_node=int(p.get("gpus_per_node") or 0),
                    time_min=max(int(t.time_min) for t in group),
                )
            )
        return out

    def check_fits(self, tasks: list[LaunchTask]) -> None:
        """Unrunnable when a job asks for more nodes, CPUs or GPUs per node, or time than its partition has:
        sbatch would take it and Slurm would keep it pending forever (PartitionConfig)."""
        part = self.target()
        why = partition.refusal(self.requests(tasks), part) if part is not None and tasks else None
        if why:
            raise Unrunnable(why)

    def submit(self, tasks: list[LaunchTask], on_submitted: OnSubmitted | None = None) -> list[Submitted]:
        self.check_fits(tasks)
        out: list[Submitted] = [None] * len(tasks)  # type: ignore[list-item]  # every slot is filled below
        for chunk in self.arrays(tasks):
            subs = self._submit_array([tasks[i] for i in chunk])
            for i, sub in zip(chunk, subs):
                out[i] = sub
            if on_submitted is None:
                continue
            try:
                on_submitted(list(zip(chunk, subs)))
            except BaseException as exc:  # not recorded: no task of this array may run untracked (one scancel)
                for i, sub in zip(chunk, subs):
                    mark_aborted(tasks[i], sub.job_id, exc)
                self.cancel(sorted({s.job_id.split("_")[0] for s in subs}))
                raise
        return out

    def find(self, intents: list[tuple[str, int | None, str]], since: datetime) -> dict[tuple[str, int | None], Found]:
        """As `intents.find`, an intent of several array tasks (a rank probe) found as all of them: from its
        own index up to the next intent's of its token (the last: the highest index Slurm knows)."""
        found = intents_mod.find(intents, since=since)
        starts: dict[str, list[int]] = defaultdict(list)
        for token, idx, _ in intents:
            if idx is not None:
                starts[token].append(idx)
        known: dict[str, list[int]] = defaultdict(list)
        for token, idx in found:
            if idx is not None:
                known[token].append(idx)
        for token, idxs in starts.items():
            idxs.sort()
            for lo, nxt in zip(idxs, [*idxs[1:], max(known[token], default=-1) + 1]):
                first = found.get((token, lo))
                if first is not None and nxt - 1 > lo:
                    ids = [f"{first.job_id.split('_')[0]}_{k}" for k in range(lo, nxt)]
                    found[(token, lo)] = replace(first, job_id=span(ids))
        return found

    def _submit_array(self, tasks: list[LaunchTask]) -> list[Submitted]:
        import submitit

        folder = self.executor_folder(tasks)
        os.makedirs(folder, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=folder, python=container.python(self.cluster))
        executor.update_parameters(**self.parameters(tasks, folder))

        def alone_env(t: LaunchTask, k: int) -> dict[str, str] | None:
            return {ALONE_INDEX_ENV: str(k)} if t.alone > 1 else None

        try:
            with executor.batch():
                jobs = [
                    [
                        executor.submit(
                            RunInFolder(t.fn, t.args, t.folder, env=alone_env(t, k), token=t.token, launcher=self.kind)
                        )
                        for k in range(max(1, t.alone))
                    ]
                    for t in tasks
                ]
        except Exception as exc:
            raise LaunchError(f"sbatch failed for {len(tasks)} task(s) ({tasks[0].name} ...): {exc}") from exc
        finally:
            self.sbatch_calls += 1
        subs = []
        for t, own in zip(tasks, jobs):
            ids = [str(job.job_id) for job in own]
            jid = ids[0] if len(ids) == 1 else span(ids)  # a rank probe's tasks: "123_[4-6]"
            subs.append(
                Submitted(job_id=jid, array_index=int(ids[0].split("_")[1]) if "_" in ids[0] else None, folder=t.folder)
            )
            self._folders[jid] = t.folder
        return subs

    # -- poll / cancel / result -------------------------------------------------------------------------
    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        members = {j: sacct.expand_job_id(j) for j in ids}  # a rank probe's one-GPU tasks: each its own row
        self.sacct_calls += 1
        try:
            proc = subprocess.run(
                sacct.command([m for ms in members.values() for m in ms]), capture_output=True, text=True, timeout=120
            )
            error = proc.stderr.strip() if proc.returncode else ""
            found = sacct.parse(proc.stdout) if not error else {}
        except (OSError, subprocess.TimeoutExpired) as exc:
            error, found = str(exc), {}
        # A job sacct does not list yet (accounting lags 1-2 s) or a failed query stays live: UNKNOWN.
        why = f"sacct failed: {error[:200]}" if error else "not in accounting yet"
        each = {
            m: sacct.state_for(found, m) or JobState(state=AttemptState.UNKNOWN, reason=why)
            for ms in members.values()
            for m in ms
        }
        self.stop_if_stuck([m for m, st in each.items() if st.state == AttemptState.PENDING])
        return {j: each[ms[0]] if len(ms) == 1 else merged([each[m] for m in ms]) for j, ms in members.items()}

    def stop_if_stuck(self, pending: list[str]) -> None:
        """Read Slurm's reason for the pending jobs (one squeue); when one never clears (PartitionConfig,
        PartitionNodeLimit, PartitionTimeLimit, ReqNodeNotAvail on a drained partition ...), cancel every
        pending job asked about and raise Unrunnable with the reason and the fix: waiting would wait forever."""
        if not pending:
            return
        for jid, reason in partition.pending_reasons(pending).items():
            if partition.fatal_reason(reason, None) is None and not reason.startswith("ReqNodeNotAvail"):
                continue  # Resources, Priority, Dependency ...: waiting helps (no partition read)
            # the partition as it is now (drained?), not the answer cached at the first check
            part = self._partition = partition.read(self.cluster.slurm.partition)
            fatal = partition.fatal_reason(reason, part)
            if fatal is None:
                continue
            self.cancel(sorted({j.split("_")[0] for j in pending}))
            size = f"; {part.size()}" if part is not None else ""
            raise Unrunnable(
                f"job {jid} pends with reason {reason}: {fatal}{size}; cancelled the {len(pending)} pending job(s) "
                "of this call (fix the request and run again)"
            )

    def cancel(self, job_ids: list[str]) -> None:
        ids = [str(j) for j in job_ids]
        if not ids:
            return
        self.scancel_calls += 1
        subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=120)

    def result(self, job_id: str) -> Any:
        folder = self._folders.get(str(job_id))
        if folder is None:
            raise LaunchError(f"job {job_id}: folder unknown (after a restart, call attach() with the stored ids)")
        return read_result(folder)
