"""One `sacct` call for any number of jobs, and its parsing.

Why not submitit's job.state: every submitit watcher issues its own sacct calls; a sweep with
thousands of jobs must cost the controller one query per poll, whatever the job count.
Array jobs are queried by their base id: a pending array is a single accounting row
("123_[2-4%2]") that `sacct -j 123_4` does not find. `--duplicates` keeps the records of earlier runs
of a job Slurm requeued itself (a NODE_FAIL is requeued under the same id): the state is the latest
run's, `previous` lists the earlier ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

from orchestrator.launch.base import JobState, state_of

FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Start", "End", "Reason")
_ARRAY = re.compile(r"^(?P<base>\d+)_\[(?P<ranges>[0-9,\-]+)(?:%\d+)?\]$")


def command(job_ids: Iterable[str], sacct: str = "sacct") -> list[str]:
    bases = sorted({str(j).split("_")[0].split(".")[0] for j in job_ids}, key=lambda b: (len(b), b))
    return [
        sacct,
        "--parsable2",
        "--noheader",
        "--allocations",
        "--duplicates",
        "-j",
        ",".join(bases),
        "-o",
        ",".join(FIELDS),
    ]


def expand_job_id(job_id: str) -> list[str]:
    """'123' -> ['123'], '123_4' -> ['123_4'], '123_[1-3,7%2]' -> ['123_1', '123_2', '123_3', '123_7']."""
    m = _ARRAY.match(job_id)
    if not m:
        return [job_id]
    out = []
    for part in m.group("ranges").split(","):
        lo, _, hi = part.partition("-")
        out += [f"{m.group('base')}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def _time(value: str) -> datetime | None:
    """sacct prints the controller's local time without a zone; make it aware (UTC)."""
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(value).astimezone().astimezone(UTC)
    except ValueError:
        return None


def _row_state(fields: dict[str, str]) -> JobState:
    code, _, sig = fields.get("ExitCode", "").partition(":")
    nodes = fields.get("NodeList") or None
    reason = fields.get("Reason") or None
    return state_of(
        fields.get("State", ""),
        exit_code=int(code) if code.isdigit() else None,
        signal=int(sig) if sig.isdigit() else None,
        node_list=None if nodes in (None, "None assigned") else nodes,
        start=_time(fields.get("Start", "")),
        end=_time(fields.get("End", "")),
        reason=None if reason in (None, "None") else reason,
    )


def parse(text: str) -> dict[str, JobState]:
    """Map every job id (array tasks expanded) to its latest run's state (sacct lists runs in order)."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < len(FIELDS) or not parts[0]:
            continue
        fields = dict(zip(FIELDS, parts))
        if "." in fields["JobID"] or "+" in fields["JobID"]:
            continue  # job steps and heterogeneous components: the allocation row speaks for the job
        st = _row_state(fields)
        for jid in expand_job_id(fields["JobID"]):
            earlier = states.get(jid)
            states[jid] = replace(st, previous=(*earlier.previous, earlier.state)) if earlier else st
    return states


def state_for(states: dict[str, JobState], job_id: str) -> JobState | None:
    """The state of one job id in `parse`'s map. An array task sacct does not list takes its array's row
    under the bare base id: an array cancelled while still pending is one record, listed as `123`, never
    as `123_0` or `123_[0-1]` (seen with Slurm 22.05), and its tasks must not stay UNKNOWN (live) forever.

    Only the state is borrowed, never the node or the times: that row is the array's, and the node it names
    is the one task whose raw id is the base (the last task, as Slurm numbers them), so each task that took
    it was recorded on that task's node (issue 22: task _0 ran on n1, the ledger said n4, and a NODE_FAIL
    retry excluded the wrong node). A task's node comes from its own row, `123_0`, once sacct lists it."""
    jid = str(job_id)
    if jid in states:
        return states[jid]
    base = states.get(jid.split("_")[0]) if "_" in jid else None
    return None if base is None else replace(base, node_list=None, start=None)
