"""Re-ingest measurements found in job folders into a ledger (`ledger ingest FOLDER`): the rows a lost ledger
held, rebuilt through the Ledger's own methods (the sweep, its candidate by layout key, the attempt by its
launch token, the result through `ledger.evidence.record_result`: there is no second way to store a result).

Which folders are trusted is orchestrator/evidence/ingest.py's rule; this module only stores what it is given.
Idempotent: an attempt already recorded with a result is left alone, so ingesting twice adds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.spec import JobSpec
from orchestrator.core.states import CandidateStatus
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.ledger import CandidateIn, Ledger

INGESTED = "ingested"  # the sweep's provenance part and event kind of rows rebuilt from job folders


@dataclass(frozen=True)
class Measured:
    """A trusted measurement of one job folder (orchestrator/evidence/ingest.py `OnDisk` with a result)."""

    spec: JobSpec
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


def snapshot(spec: JobSpec) -> tuple[str, bool]:
    """The sweep's config snapshot: the one its job.json carries, else (an older job.json) one rebuilt from the
    spec's groups (model, stage, hardware, workload; every other group at its default). JSON is YAML."""
    if spec.sweep_config:
        return spec.sweep_config, True
    rebuilt: dict[str, Any] = {
        "model": asdict(spec.model),
        "stage": asdict(spec.stage),
        "hardware": asdict(spec.hardware),
        "workload": asdict(spec.workload),
        "sweep": {"name": spec.sweep},
    }
    return json.dumps(rebuilt, default=str, sort_keys=True), False


def ingest(ledger: Ledger, found: Sequence[Measured], *, source: str) -> Summary:
    """Store every measurement of `found` not yet in `ledger`; `source` (the folder) goes into the events."""
    out = Summary()
    order = sorted(found, key=lambda x: (x.spec.sweep, x.spec.candidate_key, x.spec.attempt))
    for name in dict.fromkeys(x.spec.sweep for x in order):  # refused before anything is written
        lease = ledger.leases.lease(name) if ledger.get_sweep(name) is not None else None
        if lease is not None and lease.alive is not False and not lease.expired:
            raise LedgerError(
                f"sweep {name} is driven by {lease.holder} right now: its driver collects its own jobs; "
                "ingest once it has stopped (or `resume` it)"
            )
    for item in order:
        spec = item.spec
        name = spec.sweep
        if name not in out.sweeps:
            _sweep(ledger, spec, source)
            out.sweeps.append(name)
        cand = ledger.candidate_by_key(name, spec.candidate_key)
        if cand is None:
            (cand,) = ledger.add_candidates(
                name,
                [
                    CandidateIn(
                        key=spec.candidate_key,
                        layout=spec.layout,
                        layer_pattern=str(spec.predicted.get("layer_pattern") or ""),
                        predicted=spec.predicted,
                        round=int(spec.round or 0),
                        status=CandidateStatus.DONE,
                        decision=spec.decision,
                    )
                ],
            )
        atts = ledger.attempts(cand.id, roles=None)
        mine = next((a for a in atts if a.launch_token == spec.launch_token), None)
        if mine is not None and ledger.evidence.result(mine.id) is not None:
            out.present.append(item.job_dir)
            continue
        if mine is None:
            other = next((a for a in atts if a.attempt_no == spec.attempt), None)
            if other is not None:
                why = f"attempt {spec.attempt} of {spec.candidate_key[:10]} is in the ledger as another launch"
                out.skipped.append((item.job_dir, f"{why} ({other.launch_token or 'no token'})"))
                continue
            mine = ledger.new_attempt(
                cand.id,
                job_id=item.job_id or None,
                job_dir=item.job_dir,
                simulated=bool(item.result.get("simulated", spec.workload.simulated)),
                launch_token=spec.launch_token,
                fidelity=spec.fidelity,
                role=spec.role,
                attempt_no=spec.attempt,
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
        n = sum(1 for x in order if x.spec.sweep == name and x.job_dir in out.ingested)
        if n:
            ledger.log_event(name, INGESTED, f"{n} measured result(s) ingested from {source}", data={"n": n})
    return out


def _sweep(ledger: Ledger, spec: JobSpec, source: str) -> None:
    """Find the spec's sweep, or create it from the snapshot its job.json carries (marked as ingested)."""
    if ledger.get_sweep(spec.sweep) is not None:
        return
    config_yaml, stored = snapshot(spec)
    how = "the snapshot in its job.json" if stored else "its job.json's groups (other groups at their defaults)"
    ledger.create_or_get_sweep(
        spec.sweep,
        stage=spec.stage.name,
        config_yaml=config_yaml,
        model=spec.model.name,
        hardware=spec.hardware.name,
        workload=spec.workload.name,
        provenance={INGESTED: {"from": source, "config": how}},
    )
