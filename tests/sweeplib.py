"""Helpers for the sweep tests: run the real CLI in a subprocess and read the ledger it wrote."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from db.ledger import Ledger

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


def wait_for(pred, timeout: float, what: str, every: float = 0.3):
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
    """Every candidate ended (done / failed / cancelled), each attempt has a job id, ids are unique."""
    cands = ledger.candidates(sweep)
    assert cands
    for c in cands:
        assert c.status in ("done", "failed", "cancelled", "excluded"), (c.key, c.status)
    atts = all_attempts(ledger, sweep)
    ids = [a.job_id for a in atts]
    assert all(ids) and len(ids) == len(set(ids)), ids
    for c in cands:
        if c.status == "done":
            assert ledger.result(ledger.attempts(c.id)[-1].id) is not None
