"""The callable submitit runs on the compute node around the caller's `fn(*args)`.

Why: submitit answers the warning signal it asks Slurm for (USR2, `signal_delay_s` before the limit) by
raising "timed-out and not checkpointable" in rank 0, so a job that runs past its limit would end as a
FAILED job `signal_delay_s` early. The orchestrator wants Slurm's own verdict (TIMEOUT) and the full
time, so the warning is only recorded in the job folder and the job runs until Slurm stops it.

With a launch token (the sweep's launches, on either launcher), the job also leaves its own evidence:
`job-started.json` as it starts and `job-exit.json` as it returns or raises (core/paths JobPaths.STARTED /
EXITED; on Slurm every task of the job writes them). A local job has no scheduler to ask after a kill -9 of
its orchestrator; these files, written by the job itself, are what `LocalLauncher.find` adopts it by (a job
that ran, or ran to its end, before its id was recorded), and what `ledger ingest` trusts a folder by.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from orchestrator.core import proc
from orchestrator.core.paths import JobPaths, atomic_write


class RunInFolder:
    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        folder: str,
        env: dict[str, str] | None = None,
        token: str = "",
        launcher: str = "",
    ) -> None:
        self.fn, self.args, self.folder, self.env, self.token = fn, tuple(args), folder, dict(env or {}), token
        self.launcher = launcher  # the launcher kind running it (local, slurm): the records name it for `ledger ingest`

    def _warned(self, signum: int, frame: Any) -> None:
        rank = os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))
        try:
            with open(JobPaths(self.folder).time_limit_mark(rank), "w") as fh:
                fh.write(f"signal {signum} at {time.time():.3f}\n")
        except OSError:
            pass

    def __call__(self) -> Any:
        os.environ.update(self.env)
        os.makedirs(self.folder, exist_ok=True)
        signal.signal(signal.SIGUSR2, self._warned)
        if not self.token:
            return self.fn(*self.args)
        paths = JobPaths(self.folder)
        self._mark(paths.started, pid=os.getpid(), task=proc.identity(os.getpid()))  # task: its `pid:start`
        try:
            out = self.fn(*self.args)
        except Exception as exc:  # a failure is an end too; a KeyboardInterrupt (cancel) is not: no marker
            code = getattr(exc, "returncode", None)  # the rank's exit status (job/entry TaskFailed); < 0: a signal
            self._mark(paths.exited, outcome="error", returncode=code if isinstance(code, int) else None)
            raise
        self._mark(paths.exited, outcome="ok")
        return out

    def _mark(self, path: Any, **fields: Any) -> None:
        """The job's own record, naming its launch (token), its job id (Slurm's, or the local launcher's `pid:start`
        of submitit's controller: this task's parent, so alive to be read, core/proc.py) and the launcher kind that
        ran it (what a sweep rebuilt from its folders is bound to)."""
        local = os.environ.get("SUBMITIT_LOCAL_JOB_ID", "")
        job_id = proc.identity(int(local)) if local.isdigit() else os.environ.get("SLURM_JOB_ID") or local
        rec = {"token": self.token, "job_id": job_id, "at": time.time(), **fields}
        atomic_write(path, json.dumps({**rec, "launcher": self.launcher} if self.launcher else rec))
