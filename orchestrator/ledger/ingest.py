"""Re-ingest measurements found in job folders into a ledger (`ledger ingest FOLDER`): the rows a lost ledger
held, rebuilt through the Ledger's own methods (the sweep, its candidate by layout key, the attempt by its
launch token, the result through `ledger.evidence.record_result`: there is no second way to store a result).

Which folders are trusted is orchestrator/evidence/ingest.py's rule; this module only stores what it is given.
Idempotent: an attempt already recorded with a result is left alone, so ingesting twice adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.states import CandidateStatus
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.ledger import CandidateIn, Ledger

INGESTED = "ingested"  # the sweep's provenance part and event kind of rows rebuilt from job folders


@dataclass(frozen=True)
class Measured:
    """A trusted measurement of one job folder, as its job.json names it (orchestrator/evidence/ingest.py
    `OnDisk.measured` builds it: the ledger reads no JobSpec)."""

    sweep: str
    stage: str
    model: str
    hardware: str
    workload: str
    config_yaml: str  # the sweep's config snapshot (its job.json's, else rebuilt from the spec's groups)
    config_from: str  # where config_yaml came from, in words (the sweep's `ingested` provenance)
    key: str  # the candidate's layout key
    layout: dict[str, Any]
    predicted: dict[str, Any]
    round: int
    decision: dict[str, Any] | None
    attempt: int  # the folder's attempt number
    launch_token: str
    fidelity: str
    role: str
    simulated: bool
    result: dict[str, Any]  # JobResult.to_dict()
    job_dir: str
    job_id: str = ""
    started_at: float | None = None
    ended_at: float | None = None


@dataclass
class Summary:
    ingested: list[str] = field(default_factory=list)  # job folders stored now
    present: list[str] = field(default_factory=list)  # already recorded with a result: left alone
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (job folder, why)
    sweeps: list[str] = field(default_factory=list)  # the sweeps they belong to, in order


def ingest(ledger: Ledger, found: Sequence[Measured], *, source: str) -> Summary:
    """Store every measurement of `found` not yet in `ledger`; `source` (the folder) goes into the events."""
    out = Summary()
    order = sorted(found, key=lambda x: (x.sweep, x.key, x.attempt))
    for name in dict.fromkeys(x.sweep for x in order):  # refused before anything is written
        lease = ledger.leases.lease(name) if ledger.get_sweep(name) is not None else None
        if lease is not None and lease.alive is not False and not lease.expired:
            raise LedgerError(
                f"sweep {name} is driven by {lease.holder} right now: its driver collects its own jobs; "
                "ingest once it has stopped (or `resume` it)"
            )
    for item in order:
        name = item.sweep
        if name not in out.sweeps:
            _sweep(ledger, item, source)
            out.sweeps.append(name)
        cand = ledger.candidate_by_key(name, item.key)
        if cand is None:
            (cand,) = ledger.add_candidates(
                name,
                [
                    CandidateIn(
                        key=item.key,
                        layout=item.layout,
                        layer_pattern=str(item.predicted.get("layer_pattern") or ""),
                        predicted=item.predicted,
                        round=item.round,
                        status=CandidateStatus.DONE,
                        decision=item.decision,
                    )
                ],
            )
        atts = ledger.attempts(cand.id, roles=None)
        mine = next((a for a in atts if a.launch_token == item.launch_token), None)
        if mine is not None and ledger.evidence.result(mine.id) is not None:
            out.present.append(item.job_dir)
            continue
        if mine is None:
            other = next((a for a in atts if a.attempt_no == item.attempt), None)
            if other is not None:
                why = f"attempt {item.attempt} of {item.key[:10]} is in the ledger as another launch"
                out.skipped.append((item.job_dir, f"{why} ({other.launch_token or 'no token'})"))
                continue
            mine = ledger.new_attempt(
                cand.id,
                job_id=item.job_id or None,
                job_dir=item.job_dir,
                simulated=item.simulated,
                launch_token=item.launch_token,
                fidelity=item.fidelity,
                role=item.role,
                attempt_no=item.attempt,
            )
        times: dict[str, Any] = {
            k: v for k, v in (("start_time", item.started_at), ("end_time", item.ended_at)) if v is not None
        }
        if item.job_id and not mine.job_id:
            times["job_id"] = item.job_id
        if times:
            ledger.update_attempt(mine.id, **times)
        ledger.evidence.record_result(mine.id, item.result)
        out.ingested.append(item.job_dir)
    for name in out.sweeps:
        n = sum(1 for x in order if x.sweep == name and x.job_dir in out.ingested)
        if n:
            ledger.log_event(name, INGESTED, f"{n} measured result(s) ingested from {source}", data={"n": n})
    return out


def _sweep(ledger: Ledger, item: Measured, source: str) -> None:
    """Find the item's sweep, or create it from the config snapshot its job.json gave (marked as ingested)."""
    if ledger.get_sweep(item.sweep) is not None:
        return
    ledger.create_or_get_sweep(
        item.sweep,
        stage=item.stage,
        config_yaml=item.config_yaml,
        model=item.model,
        hardware=item.hardware,
        workload=item.workload,
        provenance={INGESTED: {"from": source, "config": item.config_from}},
    )
