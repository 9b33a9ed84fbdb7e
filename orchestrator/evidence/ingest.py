"""Job folders on disk -> the results they can be trusted for: what `ledger ingest FOLDER` stores when a
ledger was lost (deleted or replaced under a running sweep, issue 22 item 3) while the results stayed in the
job folders.

A folder's evidence is trusted only when it is the job's own and complete:
- its `job.json` names its launch token (`JobSpec.launch_token`) and, for a finalist's job, the candidate it
  is an attempt of (`JobSpec.owner_key`: a parity reference shared by several finalists is the first's);
- the job's own exit marker (`job-exit.json`, written by the job as it returned or raised:
  orchestrator/launch/task.py) exists and names that token, and so does its start record;
- the folder, collected again (orchestrator/evidence/collect.py; `result.json` is the orchestrator's, never
  evidence), is either a successful result of the attempt's whole window (a screen's or probe's own window
  counts), or a failure whose class the folder alone establishes (`TRUSTED_FAILURES`, below).
Anything else is listed as skipped with its reason, never stored. A job with no exit marker (still running,
or killed without a trace: kill -9, a node that died) is skipped: nothing says how it ended.

Which failures the folder alone establishes. The driver classifies a failed job from its folder and from
Slurm's word (sacct's state, orchestrator/evidence/classify.py); a lost ledger leaves only the folder. Trusted
are the classes of orchestrator/core/failures.py TABLE that a rank's own log lines prove and that no retry
runs again by default (`log` evidence, `Retry.NEVER`): INVALID_CONFIG and OOM, the layout's own verdicts that
the search learns from (select.oom_dominated, calibration's OOM lower bounds, the capacity an OOM message
states: orchestrator/history/capacity.py), and CRASH (a traceback or a non-zero exit of the workload itself),
the outcome the driver would not retry either. A CRASH counts only when the exit marker records the rank's
exit status and it is a plain non-zero exit (or the job ended well and collect still failed it, as a restore
that loaded no checkpoint): a rank killed by a signal was most likely stopped from outside (time limit,
preemption, a node failure, the host's OOM killer), which Slurm's word would name and the folder cannot. For
the same reason a failed job that received Slurm's early time-limit warning is skipped. Classes the sweep
retries (NCCL_TIMEOUT, TIMEOUT, PREEMPTED, NODE_FAIL, LOST) are no verdict on the layout: `resume` measures
it again, as the driver would have; CANCELLED and NO_OUTPUT rest on Slurm's word or on nothing. A rank probe's
CRASH or NO_OUTPUT is PROBE_FAILED (collect, as the driver stores it), trusted under CRASH's rules.

A launch the sweep cut early (its folder holds the cut's mark, JobPaths.CUT, written before the cancel:
orchestrator/sweep/cutoff.py) is read as the driver read it: the result of the iterations its cut read (its
window the cut's), the attempt a screen (cutoff.settle), and a job that raised after the mark stopped by the
sweep's own cancel (CANCELLED, as its launcher reported it: the SIGINT's exit status, 130, is no crash;
collect's `as_cut`). A mark naming another launch's token is another launch's evidence. A launch its launcher
cancelled because the sweep could not record its job id (JobPaths.ABORTED) is no verdict unless it ended well:
skipped, and resume runs it again. Nothing here writes
the ledger: orchestrator/ledger/ingest.py stores what this finds.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.core.errors import UserError
from orchestrator.core.failures import TABLE, Failure, Retry, retried_by_default
from orchestrator.core.paths import JobPaths
from orchestrator.core.result import JobResult
from orchestrator.core.spec import JobSpec
from orchestrator.core.states import AttemptRole, AttemptState, Fidelity
from orchestrator.evidence.collect import collect, cut_window, read_cut
from orchestrator.launch import auto
from orchestrator.launch.base import read_aborted

# what a folder alone proves (the module's rules): INVALID_CONFIG, OOM, CRASH, and a probe's crash or silence
# (PROBE_FAILED: what collect reads a rank probe's CRASH or NO_OUTPUT as, under CRASH's rules)
TRUSTED_FAILURES: tuple[str, ...] = (
    *(fc.name for fc in TABLE if fc.log and fc.retry is Retry.NEVER),
    Failure.PROBE_FAILED,
)
CRASHES = (Failure.CRASH, Failure.PROBE_FAILED)  # a workload's own non-zero exit: counted only with its status


@dataclass(frozen=True)
class OnDisk:
    """One job folder and what it can be trusted for: `result` set (a complete result or a trusted failure) or
    `skipped` (why not)."""

    folder: Path
    spec: JobSpec | None = None
    result: JobResult | None = None
    job_id: str = ""
    started_at: float | None = None  # the job's own start record and exit marker (epoch seconds)
    ended_at: float | None = None
    skipped: str = ""
    cut: dict[str, Any] | None = None  # the sweep's mark that it cut this launch early (JobPaths.CUT)
    launcher: str = ""  # the launcher kind that ran it (`launcher_of`), "" when the folder does not say

    def record(self) -> dict[str, Any]:
        """What the ledger stores of a trusted folder (orchestrator/ledger/ingest.py `Trusted`'s fields)."""
        spec, result = self.spec, self.result
        if spec is None or result is None:
            raise ValueError(f"{self.folder} holds no trusted result: {self.skipped}")
        config_yaml, config_from = snapshot(spec)
        return dict(
            sweep=spec.sweep,
            stage=spec.stage.name,
            model=spec.model.name,
            hardware=spec.hardware.name,
            workload=spec.workload.name,
            gpus=int(spec.stage.gpus),
            launcher=self.launcher,
            config_yaml=config_yaml,
            config_from=config_from,
            key=spec.candidate_key,
            owner_key=spec.owner_key or spec.candidate_key,
            layout=spec.layout,
            predicted=spec.predicted,
            round=int(spec.round or 0),
            decision=spec.decision,
            attempt=int(spec.attempt),
            launch_token=spec.launch_token,
            fidelity=str(Fidelity.SCREEN if self.cut is not None else spec.fidelity),  # cutoff.settle's rule
            role=str(spec.role),
            simulated=bool(result.simulated or spec.workload.simulated),
            result=result.to_dict(),
            job_dir=str(self.folder),
            job_id=self.job_id,
            started_at=self.started_at,
            ended_at=self.ended_at,
            cut=self.cut,
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


# How deep a job folder lies under the folders `ledger ingest` is named: cluster.folder/<sweep>/<candidate>/attempt-<n>
# (JobPaths.of_attempt; a finalist's parity-<n>/ and long-run folders lie beside attempt-<n>). Nothing deeper is read.
DEPTH = 3


def job_folders(root: str | os.PathLike[str], unreadable: list[tuple[Path, str]] | None = None) -> list[Path]:
    """The job folders (a `job.json` inside) at `root` or up to DEPTH folders under it, in path order; a job
    folder's own subfolders (checkpoints, submitit's) are not walked. A UserError (nothing read further) when
    `root` does not exist, is no folder, is the filesystem's root, holds no job folder, or holds a link that
    leads out of it: a job folder is read only where it lies under the folder it was named by. A folder that
    cannot be read is appended to `unreadable` with why (it holds no job folder this command can read)."""
    given = Path(root).expanduser()
    fix = "name a sweep's job folder (cluster.folder/<sweep>) or one job folder"
    try:
        given.stat()
    except FileNotFoundError:
        raise UserError(f"{given} does not exist: {fix}") from None
    except OSError as exc:
        raise UserError(f"{given} cannot be read ({exc.strerror or exc}): {fix}") from None
    if not given.is_dir():
        raise UserError(f"{given} is not a folder: {fix}")
    top = given.resolve()
    if top == Path(top.anchor):
        raise UserError(f"{top} is the filesystem's root, not a sweep's job folders: {fix}")
    skipped = unreadable if unreadable is not None else []
    found: list[Path] = []
    _visit(top, top, 0, found, skipped)
    if not found:
        why = f" ({len(skipped)} folder(s) could not be read, e.g. {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        raise UserError(
            f"{top} holds no job folder (no {JobPaths.SPEC} in it or up to {DEPTH} folders under it){why}: {fix}"
        )
    return found


def _visit(folder: Path, top: Path, depth: int, found: list[Path], unreadable: list[tuple[Path, str]]) -> None:
    """`job_folders`' walk of one folder: its links checked, a job folder recorded, others walked to DEPTH."""
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        unreadable.append((folder, f"cannot be read ({exc.strerror or exc})"))
        return
    subfolders: list[Path] = []
    for entry in entries:
        path = Path(entry.path)
        try:
            if entry.is_symlink():
                where = path.resolve()
                if not _inside(where, top):
                    raise UserError(
                        f"{path} links to {where}, outside {top}: remove the link, or ingest {where} itself"
                    )
            elif entry.is_dir(follow_symlinks=False) and entry.name != JobPaths.SUBMITIT:
                subfolders.append(path)
        except (OSError, RuntimeError) as exc:  # a link that cannot be followed (a loop, no permission)
            unreadable.append((path, f"cannot be read ({getattr(exc, 'strerror', None) or exc})"))
    if any(e.name == JobPaths.SPEC for e in entries):
        found.append(folder)
        return
    if depth < DEPTH:
        for sub in subfolders:
            _visit(sub, top, depth + 1, found, unreadable)


def judge(folder: Path) -> OnDisk:
    """What one job folder can be trusted for (see the module's rules)."""
    paths = JobPaths(folder)
    try:
        spec = JobSpec.load(paths.spec)
    except (OSError, ValueError, TypeError) as exc:
        return OnDisk(folder, skipped=f"{JobPaths.SPEC} cannot be read ({type(exc).__name__}: {exc})"[:300])
    token = spec.launch_token
    if not token:
        why = f"{JobPaths.SPEC} names no launch token (run-one, or an older orchestrator): nothing ties it to a launch"
        return OnDisk(folder, spec, skipped=why)
    if spec.role == AttemptRole.PARITY_REFERENCE and not spec.owner_key:
        why = f"a parity reference whose {JobPaths.SPEC} names no finalist it ran for (an older orchestrator)"
        return OnDisk(folder, spec, skipped=why)
    exited, started = _read(paths.exited), _read(paths.started)
    if exited is None:
        why = f"no exit marker of its own ({JobPaths.EXITED}): the job still runs, was killed, or never started"
        return OnDisk(folder, spec, skipped=why)
    for what, rec in ((JobPaths.EXITED, exited), (JobPaths.STARTED, started)):
        if rec is not None and rec.get("token") != token:
            why = f"its {what} names launch {rec.get('token')!r}, not this job's {token!r}: another launch's evidence"
            return OnDisk(folder, spec, skipped=why)
    outcome, code = exited.get("outcome"), exited.get("returncode")
    if outcome not in ("ok", "error"):
        return OnDisk(folder, spec, skipped=f"its exit marker says outcome {outcome!r}, neither 'ok' nor 'error'")
    job_id = str(exited.get("job_id") or "")
    cut = read_cut(folder)
    if cut is not None and cut.get("token") not in (None, "", token):  # an older mark names no token
        why = f"its {JobPaths.CUT} names launch {cut.get('token')!r}, not this job's {token!r}: another launch's mark"
        return OnDisk(folder, spec, skipped=why)
    if outcome != "ok" and read_aborted(str(folder), token) is not None:
        why = f"cancelled by its sweep before its job id was recorded ({JobPaths.ABORTED}): no verdict, resume runs it"
        return OnDisk(folder, spec, skipped=why)
    if outcome == "ok":  # ended by itself (a cut launch too, when it ran to its end before the cancel came)
        state, status = AttemptState.COMPLETED, 0
    elif cut is not None:  # stopped by the sweep's own cancel (the SIGINT's exit status is no crash): as collected
        state, status = AttemptState.CANCELLED, 0
    else:  # the job raised: a rank's non-zero exit (its status, when the marker records it)
        state, status = AttemptState.FAILED, code if isinstance(code, int) and code != 0 else 1
    try:
        result = collect(folder, slurm_state=state, exit_code=status, job_id=job_id or None)
    except OSError as exc:  # a log or sidecar that cannot be read: nothing to judge it by
        return OnDisk(folder, spec, skipped=f"its files cannot be read ({type(exc).__name__}: {exc})"[:300])
    asked = (cut_window(cut) or spec.window)[1]  # a cut launch's window is its cut's
    why = _untrusted(paths, result, asked, ended_well=outcome == "ok" or cut is not None, code=code)
    if why:
        return OnDisk(folder, spec, skipped=why[:300])
    return OnDisk(
        folder,
        spec,
        result,
        job_id=job_id,
        started_at=_at(started),
        ended_at=_at(exited),
        cut=cut,
        launcher=launcher_of(spec, paths, exited, started),
    )


def launcher_of(spec: JobSpec, paths: JobPaths, *records: dict[str, Any] | None) -> str:
    """The launcher kind that ran the job, as its folder names it: the job's own start or exit record (written
    by launch/task.RunInFolder, which its launcher tells), else the sweep's snapshot naming a registered
    cluster.kind (launch/auto `kinds`: local, slurm), else the local launcher's launch.json naming this launch;
    "" when none says (a snapshot's auto)."""
    for rec in records:
        if rec is not None and rec.get("launcher") in auto.kinds():
            return str(rec["launcher"])
    kind = _snapshot_kind(spec.sweep_config)
    if kind:
        return kind
    launch = _read(paths.launch)
    return "local" if launch is not None and launch.get("token") == spec.launch_token else ""


def _snapshot_kind(config: str) -> str:
    """cluster.kind of a config snapshot when it names a launcher (auto resolved elsewhere: "")."""
    if not config:
        return ""
    try:
        data = yaml.safe_load(config)
    except yaml.YAMLError:  # an unreadable snapshot names no launcher
        return ""
    cluster = data.get("cluster") if isinstance(data, dict) else None
    kind = cluster.get("kind") if isinstance(cluster, dict) else None
    return str(kind) if kind in auto.kinds() else ""  # the kinds a sweep is bound to: the registered backends


def _untrusted(paths: JobPaths, result: JobResult, asked: int, *, ended_well: bool, code: Any) -> str:
    """Why a collected result is no evidence to store ("" when it is: the module's rules)."""
    if result.ok:
        if result.partial or result.measure_iters < asked:
            return f"partial: {result.measure_iters}/{asked} measured iterations of its window, never a measurement"
        return ""
    fc = result.failure_class or "failed"
    what = f"failed with {fc}" + (f" ({result.failure_detail[:120]})" if result.failure_detail else "")
    if fc not in TRUSTED_FAILURES:
        if retried_by_default(fc):
            return f"{what}: a class the sweep retries, no verdict on the layout (resume measures it again)"
        return f"{what}: no verdict its folder alone can give (Slurm's word names it)"
    if not ended_well and any(paths.folder.glob(JobPaths.TIME_LIMIT_MARK.format(rank="*"))):
        return f"{what}: Slurm's time limit was near (its warning is in the folder), and Slurm's word decides then"
    if fc in CRASHES and not ended_well and not (isinstance(code, int) and code > 0):
        why = "killed by a signal (stopped from outside?)" if isinstance(code, int) else "no exit status recorded"
        return f"{what}: {why}; Slurm's word, which the folder lacks, would name the cause"
    return ""


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
