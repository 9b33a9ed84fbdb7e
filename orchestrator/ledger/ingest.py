"""Re-ingest the results found in job folders into a ledger (`ledger ingest FOLDER`): the rows a lost ledger
held, rebuilt through the Ledger's own methods (the sweep, its candidate by layout key, the attempt by its
launch token and number, the result through `ledger.evidence.record_result`: there is no second way to store
a result, so a failed attempt gets its failure class, detail and stated GPU capacity exactly as the driver
records them).

What is stored: a measure attempt's result (the candidate DONE) or trusted failure (the candidate FAILED, as
the driver settles a failure it does not retry: the search's observations read its class), and a finalist's
job (parity, parity-reference, long-run-save, long-run-restore) as an attempt of its role of the candidate it
ran for, which must be in the ledger already (its measurement is ingested with it): its result is evidence
about that candidate, never its measurement. The candidate's status follows its latest measure attempt, and
only when this ingest stored that attempt: a verdict already in the ledger is never overwritten. The
finalists' verdicts are the sweep's to record (orchestrator/sweep/finalists.py `verdicts`, which the command
calls). Which folders are trusted is orchestrator/evidence/ingest.py's rule; this module only stores what it
is given. Idempotent: an attempt already recorded with a result or a failure is left alone, so ingesting
twice adds nothing.

One sweep per name: the folders of a name are refused (a LedgerError, before anything is written) when their
stage, model, hardware, workload, GPU count or launcher kind differ from the ledger's sweep of that name, or
from each other's (another sweep that happens to share the name: merged, its best would be named the ledger
sweep's best). A sweep is bound to the launcher kind its folders name (`Ledger.bind_launcher`): every job
it rebuilds ran there, so `resume` never resolves cluster=auto again for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from orchestrator.core.states import AttemptRole, CandidateStatus, EventKind
from orchestrator.ledger.convert import decode
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.ledger import CandidateIn, Ledger


@dataclass(frozen=True)
class Trusted:
    """A trusted result of one job folder (a measurement, a finalist's result, or a trusted failure), as its
    job.json names it (orchestrator/evidence/ingest.py `OnDisk.record` builds it: the ledger reads no JobSpec)."""

    sweep: str
    stage: str
    model: str
    hardware: str
    workload: str
    config_yaml: str  # the sweep's config snapshot (its job.json's, else rebuilt from the spec's groups)
    config_from: str  # where config_yaml came from, in words (the sweep's `ingested` provenance)
    key: str  # the job's layout key (a parity reference's: the reference layout's)
    owner_key: str  # the key of the candidate it is an attempt of (its own but for a shared parity reference)
    layout: dict[str, Any]
    predicted: dict[str, Any]
    round: int
    decision: dict[str, Any] | None
    attempt: int  # the folder's attempt number
    launch_token: str
    fidelity: str
    role: str
    simulated: bool
    result: dict[str, Any]  # JobResult.to_dict(): ok, or a trusted failure
    job_dir: str
    job_id: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    gpus: int = 0  # the stage's GPU count (0: not known)
    launcher: str = ""  # the launcher kind that ran it ("": the folder does not say)
    cut: dict[str, Any] | None = None  # the sweep's mark that it cut the launch early (then a screen)


@dataclass
class Summary:
    ingested: list[str] = field(default_factory=list)  # job folders stored now
    present: list[str] = field(default_factory=list)  # already recorded with a result or a failure: left alone
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (job folder, why)
    sweeps: list[str] = field(default_factory=list)  # the sweeps they belong to, in order
    kinds: Counter[str] = field(default_factory=Counter)  # of those stored now: measured, failed, finalists'
    finalists: list[str] = field(default_factory=list)  # sweeps with finalists' attempts in the ledger now

    def counts(self) -> str:
        """The stored results in words: "3 result(s) (2 measured, 1 failed, 0 finalists' jobs)"."""
        k = self.kinds
        return (
            f"{len(self.ingested)} result(s) ({k['measured']} measured, {k['failed']} failed, "
            f"{k['finalists']} finalists' jobs)"
        )


def ingest(ledger: Ledger, found: Sequence[Trusted], *, source: str) -> Summary:
    """Store every result of `found` not yet in `ledger`; `source` (the folder) goes into the events. Measure
    attempts first, so a finalist's job finds the candidate it ran for."""
    out = Summary()
    order = sorted(found, key=lambda x: (x.role != AttemptRole.MEASURE, x.sweep, x.owner_key, x.attempt))
    for name in dict.fromkeys(x.sweep for x in order):  # refused before anything is written
        lease = ledger.leases.lease(name) if ledger.get_sweep(name) is not None else None
        if lease is not None and lease.alive is not False and not lease.expired:
            raise LedgerError(
                f"sweep {name} is driven by {lease.holder} right now: its driver collects its own jobs; "
                "ingest once it has stopped (or `resume` it)"
            )
        _same_sweep(ledger, name, [x for x in order if x.sweep == name], source)
    stored: dict[tuple[str, str], set[int]] = {}  # (sweep, candidate key) -> its measure attempts stored now
    for item in order:
        name, ok = item.sweep, bool(item.result.get("ok"))
        measure = item.role == AttemptRole.MEASURE
        if measure and name not in out.sweeps:
            _sweep(ledger, item, source)
            out.sweeps.append(name)
        cand = ledger.candidate_by_key(name, item.owner_key) if ledger.get_sweep(name) is not None else None
        if cand is None and not measure:
            why = f"a {item.role} job of candidate {item.owner_key[:10]}, which is in no ledger row"
            out.skipped.append((item.job_dir, f"{why}: ingest its measurement's folder with it"))
            continue
        if cand is None:
            (cand,) = ledger.add_candidates(
                name,
                [
                    CandidateIn(
                        key=item.key,
                        layout=decode("layout", item.layout),
                        layer_pattern=str(item.predicted.get("layer_pattern") or ""),
                        predicted=item.predicted,
                        round=item.round,
                        status=CandidateStatus.DONE if ok else CandidateStatus.FAILED,
                        decision=None if item.decision is None else decode("decision", item.decision),
                    )
                ],
            )
        if name not in out.sweeps:
            out.sweeps.append(name)
        atts = ledger.attempts(cand.id, roles=None)
        mine = next((a for a in atts if a.launch_token == item.launch_token and a.attempt_no == item.attempt), None)
        if mine is not None and (ledger.evidence.result(mine.id) is not None or (mine.terminal and mine.failure_class)):
            out.present.append(item.job_dir)
            if not measure and name not in out.finalists:
                out.finalists.append(name)
            continue
        if mine is None:
            other = next((a for a in atts if a.attempt_no == item.attempt), None)
            if other is not None:
                why = f"attempt {item.attempt} of {item.owner_key[:10]} is in the ledger as another launch"
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
        out.kinds["finalists" if not measure else "measured" if ok else "failed"] += 1
        if measure:
            stored.setdefault((name, cand.key), set()).add(mine.id)
        elif name not in out.finalists:
            out.finalists.append(name)
    for (name, key), ids in stored.items():
        _settle(ledger, name, key, ids)
    for name in out.sweeps:  # every job it rebuilt ran on that launcher: the sweep is bound to it
        kinds = {x.launcher for x in order if x.sweep == name and x.launcher}
        if len(kinds) == 1 and ledger.get_sweep(name) is not None:
            ledger.bind_launcher(name, kinds.pop())
    for name in out.sweeps:
        n = sum(1 for x in order if x.sweep == name and x.job_dir in out.ingested)
        if n:
            ledger.log_event(name, EventKind.INGESTED, f"{n} result(s) ingested from {source}", data={"n": n})
    return out


def _settle(ledger: Ledger, sweep: str, key: str, stored: set[int]) -> None:
    """The candidate's status from its latest measure attempt, as the driver settles it (measured: done; a
    failure it does not retry: failed), when that attempt is one this ingest stored."""
    cand = ledger.candidate_by_key(sweep, key)
    assert cand is not None  # stored just now
    last = max(ledger.attempts(cand.id), key=lambda a: a.attempt_no)
    if last.id not in stored:
        return
    if ledger.evidence.result(last.id) is not None:
        status, why = CandidateStatus.DONE, f"job {last.job_id or '?'} measured (ingested from its job folder)"
    else:
        status = CandidateStatus.FAILED
        why = f"{last.failure_class or last.state}: ingested from its job folder ({(last.failure_detail or '')[:160]})"
    if cand.status != CandidateStatus.EXCLUDED and (cand.status != status or not cand.reason):
        ledger.set_candidate_status(cand.id, status, why)


def identity(item: Trusted) -> dict[str, Any]:
    """What makes a job folder one of a given sweep's (the checks of `_same_sweep`); 0 / "": not known."""
    return dict(
        stage=item.stage,
        model=item.model,
        hardware=item.hardware,
        workload=item.workload,
        gpus=item.gpus,
        launcher=item.launcher,
    )


def _stored_gpus(config_yaml: str) -> int:
    """stage.gpus of a stored config snapshot (0 when it does not say)."""
    try:
        data = yaml.safe_load(config_yaml or "")
    except yaml.YAMLError:
        return 0
    stage = data.get("stage") if isinstance(data, dict) else None
    gpus = stage.get("gpus") if isinstance(stage, dict) else None
    return gpus if isinstance(gpus, int) else 0


def _same_sweep(ledger: Ledger, name: str, items: Sequence[Trusted], source: str) -> None:
    """A LedgerError (nothing written yet) when `items` are not all of one sweep: the ledger's sweep `name`,
    else the first folder's. Fields one side does not know (no GPU count in a snapshot, an unbound launcher)
    are not compared."""
    row = ledger.get_sweep(name)
    if row is not None:
        theirs = dict(
            stage=row.stage,
            model=row.model,
            hardware=row.hardware,
            workload=row.workload,
            gpus=_stored_gpus(row.config_yaml),
            launcher=str(row.provenance.get("launcher") or ""),
        )
        where = f"the ledger's sweep {name}"
    else:
        theirs, where = identity(items[0]), f"the sweep {name} of {items[0].job_dir}"
    for item in items:
        ours = identity(item)
        diff = [f"{k} {ours[k]} (not {theirs[k]})" for k in ours if ours[k] and theirs[k] and ours[k] != theirs[k]]
        if diff:
            raise LedgerError(
                f"{item.job_dir} is of another sweep named {name}: {', '.join(diff)} differ from {where}; nothing "
                f"was ingested: ingest {source} into a ledger of its own (ledger.url=sqlite:///{name}-rebuilt.sqlite)"
            )


def _sweep(ledger: Ledger, item: Trusted, source: str) -> None:
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
        provenance={EventKind.INGESTED: {"from": source, "config": item.config_from}},
    )
