"""Find Slurm jobs by launch token (their job name): what `resume` adopts instead of launching again.

Why by name: the sweep loop stores a launch intent (a token) before sbatch and names the array after it, so
a job whose id never reached the ledger (kill -9 between sbatch returning and the record) is still found.
Two queries for every intent of the sweep: `squeue` (the controller's view, current the moment sbatch
returns) and `sacct --name` (jobs that already left the queue); either failing is an error, never "absent".
An array cancelled while still pending is in neither (sacct's time window skips jobs that never started): to
the caller that is the same verdict as CANCELLED, nothing of it runs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from datetime import datetime, timedelta

from orchestrator.core.states import AttemptState
from orchestrator.launch.base import Found, LaunchError
from orchestrator.launch.slurm.sacct import expand_job_id


def sacct_command(tokens: Iterable[str], since: datetime) -> list[str]:
    start = (since - timedelta(minutes=10)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")  # sacct: local time
    names = ",".join(sorted(set(tokens)))
    return [
        "sacct",
        "--parsable2",
        "--noheader",
        "--allocations",
        f"--name={names}",
        "-S",
        start,
        "-o",
        "JobID,State,JobName",
    ]


def squeue_command(tokens: Iterable[str]) -> list[str]:
    return ["squeue", "--noheader", "--array", f"--name={','.join(sorted(set(tokens)))}", "--format=%i|%T|%j"]


def _run(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"{cmd[0]} failed while looking for launched jobs: {exc}") from None
    if proc.returncode:
        raise LaunchError(f"{cmd[0]} failed while looking for launched jobs: {proc.stderr.strip()[:300]}")
    return proc.stdout


def parse(text: str, into: dict[tuple[str, int | None], Found]) -> None:
    """`JobID|State|JobName` lines (sacct or squeue) into (job name, array index) -> Found; later lines win."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0] or "." in parts[0] or "+" in parts[0]:
            continue  # job steps: the allocation row speaks for the job
        for jid in expand_job_id(parts[0]):
            _, _, idx = jid.partition("_")
            into[(parts[2], int(idx) if idx.isdigit() else None)] = Found(jid, AttemptState.parse(parts[1]))


def find(intents: list[tuple[str, int | None, str]], since: datetime) -> dict[tuple[str, int | None], Found]:
    """(token, array index) -> the job Slurm knows for it: one sacct and one squeue call for all intents."""
    tokens = sorted({t for t, _, _ in intents if t})
    out: dict[tuple[str, int | None], Found] = {}
    if tokens:
        parse(_run(sacct_command(tokens, since)), out)
        parse(_run(squeue_command(tokens)), out)  # the controller is current; accounting may lag
    return {k: v for k, v in out.items() if k[0] in tokens}
