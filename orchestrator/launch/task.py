"""The callable submitit runs on the compute node around the caller's `fn(*args)`.

Why: submitit answers the warning signal it asks Slurm for (USR2, `signal_delay_s` before the limit) by
raising "timed-out and not checkpointable" in rank 0, so a job that runs past its limit would end as a
FAILED job `signal_delay_s` early. The orchestrator wants Slurm's own verdict (TIMEOUT) and the full
time, so the warning is only recorded in the job folder and the job runs until Slurm stops it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from orchestrator.core.paths import JobPaths


class RunInFolder:
    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], folder: str, env: dict[str, str] | None = None
    ) -> None:
        self.fn, self.args, self.folder, self.env = fn, tuple(args), folder, dict(env or {})

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
        return self.fn(*self.args)
