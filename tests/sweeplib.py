"""Helpers for the sweep tests: run the real CLI in a subprocess and read the ledger it wrote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from db.ledger import AttemptRow, Ledger
from orchestrator.states import AttemptState, CandidateStatus

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
FAST_TWIN = ["++workload.twin.time_scale=0.000001", "++workload.twin.max_sleep_s=0.001"]


def sweep_args(tmp_path: Path, name: str, *extra: str, stage: str = "smoke", cluster: str = "local") -> list[str]:
    return [
        f"+stage={stage}",
        f"cluster={cluster}",
        f"sweep.name={name}",
        f"ledger.url={ledger_url(tmp_path)}",
        f"cluster.folder={tmp_path / 'runs'}",
        "++cluster.poll_interval_s=0.3",
        "++ledger.lease_ttl_s=4",
        *FAST_TWIN,
        *extra,
    ]


def ledger_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


def cli(*args: str, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "orchestrator", *args]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def popen(*args: str, log: Path, env=None) -> subprocess.Popen:
    out = open(log, "w")
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def wait_for(pred: Callable[[], T], timeout: float, what: str, every: float = 0.3) -> T:
    """Ask `pred` until it answers (truthy): the event itself, polled, never a fixed sleep."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def all_attempts(ledger: Ledger, sweep: str):
    return [a for c in ledger.candidates(sweep) for a in ledger.attempts(c.id)]


def assert_accounted(ledger: Ledger, sweep: str) -> None:
    """Every candidate ended (done / failed / cancelled), each attempt that ran has a job id, ids are unique."""
    cands = ledger.candidates(sweep)
    assert cands
    for c in cands:
        assert c.status in CandidateStatus.TERMINAL, (c.key, c.status)
    atts = [a for a in all_attempts(ledger, sweep) if not a.aborted]  # a launch intent that never ran has no id
    ids = [a.job_id for a in atts]
    assert all(ids) and len(ids) == len(set(ids)), ids
    for c in cands:
        if c.status == CandidateStatus.DONE:
            assert ledger.result(ledger.attempts(c.id)[-1].id) is not None


def first_running(ledger: Ledger, sweep: str) -> AttemptRow | None:
    """An attempt sacct (or the local executor) reports RUNNING on a known node, else None."""
    return next((a for a in all_attempts(ledger, sweep) if a.state == AttemptState.RUNNING and a.node_list), None)


def _arg(args: Sequence[str], key: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{key}="))


@dataclass
class RunningSweep:
    """A `sweep` CLI process in the background and the ledger it writes (see running_sweep)."""

    proc: subprocess.Popen
    name: str
    url: str
    log: Path

    def wait_ledger(self, pred: Callable[[Ledger], T], timeout: float, what: str) -> T:
        """Until `pred(ledger)` answers; asked only once the sweep exists (before that nothing is there)."""
        with Ledger.open(self.url) as led:
            return wait_for(lambda: led.get_sweep(self.name) is not None and pred(led), timeout, what)

    def attempts(self, n: int, timeout: float) -> list[AttemptRow]:
        """Until at least n attempts have a job id in the ledger (submitted, ids stored)."""

        def enough(led: Ledger) -> list[AttemptRow] | None:
            atts = [a for a in all_attempts(led, self.name) if a.job_id]  # not launch intents without an id
            return atts if len(atts) >= n else None

        return self.wait_ledger(enough, timeout, f"{n} job(s) in the ledger")

    def wait(self, timeout: float) -> int:
        """The process's exit status (it must end by itself within `timeout`)."""
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        """kill -9 the orchestrator only: the jobs it launched live on (what `resume` must find)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@contextmanager
def running_sweep(args: Sequence[str], *, log: Path, env=None) -> Iterator[RunningSweep]:
    """`python -m orchestrator sweep ARGS --plain` in the background (`args` as from sweep_args: they name
    the sweep and the ledger). On the way out a process still running is killed with its process group
    (its local jobs), so no test leaves an orchestrator behind."""
    proc = popen("sweep", *args, "--plain", log=log, env=env)
    try:
        yield RunningSweep(proc, _arg(args, "sweep.name"), _arg(args, "ledger.url"), log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
