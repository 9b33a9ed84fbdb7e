"""Job folders on disk -> the measurements they can be trusted for: what `ledger ingest FOLDER` stores when a
ledger was lost (deleted or replaced under a running sweep, issue 22 item 3) while the results stayed in the
job folders.

A folder's evidence is trusted only when it is the job's own and complete:
- its `job.json` is a measure attempt's (a finalist's job is evidence about a candidate, never its
  measurement: `resume` asks for it again) and names its launch token (`JobSpec.launch_token`);
- the job's own exit marker (`job-exit.json`, written by the job as it returned: orchestrator/launch/task.py)
  exists, names that token (and so does its start record) and says it ended well;
- the folder, collected again (orchestrator/evidence/collect.py; `result.json` is the orchestrator's, never
  evidence), is a successful result of the attempt's whole window (a screen's or probe's own window counts).
Anything else is listed as skipped with its reason, never stored as a measurement. Nothing here writes the
ledger: orchestrator/ledger/ingest.py stores what this finds.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.errors import UserError
from orchestrator.core.paths import JobPaths
from orchestrator.core.result import JobResult
from orchestrator.core.spec import JobSpec
from orchestrator.core.states import AttemptRole, AttemptState
from orchestrator.evidence.collect import collect


@dataclass(frozen=True)
class OnDisk:
    """One job folder and what it can be trusted for: `result` set (a complete measurement) or `skipped` (why not)."""

    folder: Path
    spec: JobSpec | None = None
    result: JobResult | None = None
    job_id: str = ""
    started_at: float | None = None  # the job's own start record and exit marker (epoch seconds)
    ended_at: float | None = None
    skipped: str = ""

    def record(self) -> dict[str, Any]:
        """What the ledger stores of a trusted folder (orchestrator/ledger/ingest.py `Measured`'s fields)."""
        spec, result = self.spec, self.result
        if spec is None or result is None:
            raise ValueError(f"{self.folder} holds no trusted measurement: {self.skipped}")
        config_yaml, config_from = snapshot(spec)
        return dict(
            sweep=spec.sweep,
            stage=spec.stage.name,
            model=spec.model.name,
            hardware=spec.hardware.name,
            workload=spec.workload.name,
            config_yaml=config_yaml,
            config_from=config_from,
            key=spec.candidate_key,
            layout=spec.layout,
            predicted=spec.predicted,
            round=int(spec.round or 0),
            decision=spec.decision,
            attempt=int(spec.attempt),
            launch_token=spec.launch_token,
            fidelity=str(spec.fidelity),
            role=str(spec.role),
            simulated=bool(result.simulated or spec.workload.simulated),
            result=result.to_dict(),
            job_dir=str(self.folder),
            job_id=self.job_id,
            started_at=self.started_at,
            ended_at=self.ended_at,
        )


def snapshot(spec: JobSpec) -> tuple[str, str]:
    """The sweep's config snapshot and where it came from: the one its job.json carries, else (a job.json of an
    older orchestrator) one rebuilt from the spec's groups (model, stage, hardware, workload; every other group
    at its default). JSON is YAML, so `resume` reads either."""
    if spec.sweep_config:
        return spec.sweep_config, "the snapshot in its job.json"
    rebuilt: dict[str, Any] = {
        "model": asdict(spec.model),
        "stage": asdict(spec.stage),
        "hardware": asdict(spec.hardware),
        "workload": asdict(spec.workload),
        "sweep": {"name": spec.sweep},
    }
    return json.dumps(rebuilt, default=str, sort_keys=True), "its job.json's groups (other groups at their defaults)"


def job_folders(root: str | os.PathLike[str]) -> list[Path]:
    """The job folders (a `job.json` inside) at or under `root`, in path order. A UserError (nothing read further)
    when `root` does not exist, is no folder, holds no job folder, or holds a link that leads out of it: a job
    folder is read only where it lies under the folder it was named by."""
    given = Path(root).expanduser()
    fix = "name a sweep's job folder (cluster.folder/<sweep>) or one job folder"
    if not given.exists():
        raise UserError(f"{given} does not exist: {fix}")
    if not given.is_dir():
        raise UserError(f"{given} is not a folder: {fix}")
    top = given.resolve()
    found: list[Path] = []
    for here, dirs, files in os.walk(top, followlinks=False):
        base = Path(here)
        dirs[:] = sorted(d for d in dirs if d != JobPaths.SUBMITIT)
        for name in [*dirs, *files]:
            path = base / name
            if path.is_symlink() and not _inside(path.resolve(), top):
                where = path.resolve()
                raise UserError(f"{path} links to {where}, outside {top}: remove the link, or ingest {where} itself")
        if JobPaths.SPEC in files:
            found.append(base)
    if not found:
        raise UserError(f"{top} holds no job folder (no {JobPaths.SPEC} in it or under it): name a sweep's job folder")
    return found


def judge(folder: Path) -> OnDisk:
    """What one job folder can be trusted for (see the module's rules)."""
    paths = JobPaths(folder)
    try:
        spec = JobSpec.load(paths.spec)
    except (OSError, ValueError, TypeError) as exc:
        return OnDisk(folder, skipped=f"{JobPaths.SPEC} cannot be read ({type(exc).__name__}: {exc})"[:300])
    if spec.role != AttemptRole.MEASURE:
        why = f"a finalist's {spec.role} job: evidence about a candidate, not its measurement (resume runs it again)"
        return OnDisk(folder, spec, skipped=why)
    token = spec.launch_token
    if not token:
        why = f"{JobPaths.SPEC} names no launch token (run-one, or an older orchestrator): nothing ties it to a launch"
        return OnDisk(folder, spec, skipped=why)
    exited, started = _read(paths.exited), _read(paths.started)
    if exited is None:
        why = f"no exit marker of its own ({JobPaths.EXITED}): the job still runs, was killed, or never started"
        return OnDisk(folder, spec, skipped=why)
    for what, rec in ((JobPaths.EXITED, exited), (JobPaths.STARTED, started)):
        if rec is not None and rec.get("token") != token:
            why = f"its {what} names launch {rec.get('token')!r}, not this job's {token!r}: another launch's evidence"
            return OnDisk(folder, spec, skipped=why)
    if exited.get("outcome") != "ok":
        why = f"the job ended with an error (exit marker outcome {exited.get('outcome')!r}): no measurement"
        return OnDisk(folder, spec, skipped=why)
    job_id = str(exited.get("job_id") or "")
    result = collect(folder, slurm_state=AttemptState.COMPLETED, exit_code=0, job_id=job_id or None)
    asked = spec.window[1]
    if not result.ok:
        why = f"not a measurement: {result.failure_class or 'failed'}: {result.failure_detail or ''}".rstrip(": ")
        return OnDisk(folder, spec, skipped=why[:300])
    if result.partial or result.measure_iters < asked:
        why = f"partial: {result.measure_iters}/{asked} measured iterations of its window, never a measurement"
        return OnDisk(folder, spec, skipped=why)
    return OnDisk(
        folder,
        spec,
        result,
        job_id=job_id,
        started_at=_at(started),
        ended_at=_at(exited),
    )


def scan(root: str | os.PathLike[str]) -> list[OnDisk]:
    """Every job folder under `root`, judged (`job_folders` refuses a bad root before any folder is read)."""
    return [judge(f) for f in job_folders(root)]


def _inside(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _at(rec: dict[str, Any] | None) -> float | None:
    value = (rec or {}).get("at")
    return float(value) if isinstance(value, int | float) else None
