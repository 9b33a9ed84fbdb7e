"""Every file name of a job folder, Megatron's checkpoint folder layout, and the one atomic write.

Why one owner: the launcher, the job (entry, twin, megatron_run), collect and the sweep all meet in the
job folder; a name spelled twice drifts (there were two constants for result.json). Like submitit's
JobPaths, a JobPaths is built from the folder and hands out paths; nothing else spells a name.

Layout of one attempt (`JobPaths.of_attempt`): `<cluster.folder>/<sweep>/<candidate folder>/attempt-<n>/`, the
candidate folder `c<number>-<layout label>-<key>` (`candidate_folder`: readable, and still named by its key)
    job.json                      the JobSpec (written before submission; re-read by collect)
    rank-<r>.out, rank-<r>.err    stdout / stderr of each evidence rank (orchestrator.plan.ranks.evidence_ranks)
    node-<host>.log               the other ranks of one node: their lines labelled `<rank>: `, bounded per rank
    sidecar-rank-<r>.json         per-rank evidence (router counts, allocator peaks), evidence ranks only
    time-limit-warning-rank-<r>   Slurm's early time-limit warning reached rank r
    result.json                   the collected JobResult (written by the orchestrator, never read as a verdict)
    launch.json                   a local launch's record (token, process id), written after the process starts
    job-started.json, job-exit.json  a local job's own start record and exit marker (token, job id, outcome)
    preflight.json                a preflight job's checks (orchestrator.job.preflight)
plus submitit's own `<job id>_<task>_log.out|err` (here, under .submitit/, or for an array under a parent's .submitit/).

Stdlib only: it runs on compute nodes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import DiskFull, UserError

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)")
_UNSAFE = re.compile(r"[^A-Za-z0-9=+.-]+")  # no ":" (container mounts, PATH-like lists split on it)


def candidate_folder(candidate_key: str, number: int | None = None, label: str = "") -> str:
    """A candidate's folder name: `c<number>-<label>-<key>` (the ledger's candidate number `status` and the
    report show, the layout's short label, then the key every record names it by; `TP1-PP8-...`), or the
    key alone for a layout that is no candidate of its own (a parity reference)."""
    if number is None:
        return candidate_key
    slug = _UNSAFE.sub("_", label.replace(" ", "-")).strip("-_")
    return "-".join(part for part in (f"c{number}", slug, candidate_key) if part)


@dataclass(frozen=True)
class JobPaths:
    """The files of one job folder."""

    folder: Path

    SPEC = "job.json"
    RESULT = "result.json"
    ATTEMPT = "attempt-{n}"
    RANK_OUT = "rank-{rank}.out"
    RANK_ERR = "rank-{rank}.err"
    SIDECAR = "sidecar-rank-{rank}.json"
    PREFLIGHT = "preflight.json"
    LAUNCH = "launch.json"  # the local executor's record of a launch: {"token", "job_id"} (the process id)
    # The job's own evidence (a local job: launch/task.RunInFolder), written by the job, not the orchestrator:
    # found after a kill that came before launch.json, and never confused with a stray result.json.
    STARTED = "job-started.json"  # {"token", "job_id", "pid"}, as the job starts
    EXITED = "job-exit.json"  # {"token", "job_id", "outcome": "ok" | "error", "returncode"}, as it returns or raises
    # The orchestrator's mark that it stopped this job at its early cut (orchestrator/sweep/cutoff.py), written
    # before the cancel: {"step_s", "after", "skip", "warmup_iters", "measure_iters", "median_s", "job_id"};
    # collect reads the result's window from it (warmup_iters, measure_iters).
    CUT = "cut.json"
    # The launcher's mark that it cancelled this launch because the caller could not record its job id
    # (launch/base.Launcher.submit's contract), written before the cancel: {"token", "job_id", "why"}. Such a
    # launch is no verdict on its layout, however its job ended: measured again (launch/base.read_aborted).
    ABORTED = "aborted.json"
    NODE_LOG = "node-{node}.log"
    NODE_LOG_GLOB = NODE_LOG.format(node="*")
    TIME_LIMIT_MARK = "time-limit-warning-rank-{rank}"
    RANK_LOG_GLOBS = (RANK_OUT.format(rank="*"), RANK_ERR.format(rank="*"))
    SIDECAR_GLOB = SIDECAR.format(rank="*")
    # submitit's own folder (its pickles and task logs): the local launcher points submitit at
    # `<folder>/.submitit/%j` (one sub-folder per process id), the Slurm launcher at `<folder>/.submitit` itself
    # (`submitit_flat_folder`); slurmstepd's `*** JOB ... CANCELLED ... ***` lands in its logs.
    SUBMITIT = ".submitit"
    SUBMITIT_GLOBS = tuple(f"{d}*_log.{ext}" for d in ("", f"{SUBMITIT}/", f"{SUBMITIT}/*/") for ext in ("out", "err"))
    # the sweep's seed (stage.warm_start): the routing-settled weights a full-window launch saves at its end
    SEED_CHECKPOINT = "seed-checkpoint"
    SUBMITIT_LOOKUP_DEPTH = 4  # an array's .submitit/ sits at the common parent of its job folders

    def __init__(self, folder: str | os.PathLike) -> None:
        object.__setattr__(self, "folder", Path(folder))

    @classmethod
    def of_attempt(
        cls,
        root: str | os.PathLike,
        sweep: str,
        candidate_key: str,
        attempt: int,
        *,
        number: int | None = None,
        label: str = "",
    ) -> JobPaths:
        """`<root>/<sweep>/<candidate folder>/attempt-<n>/` (root = cluster.folder, resolved; `candidate_folder`)."""
        name = candidate_folder(candidate_key, number, label)
        return cls(Path(root).expanduser().resolve() / sweep / name / cls.ATTEMPT.format(n=attempt))

    @property
    def spec(self) -> Path:
        return self.folder / self.SPEC

    @property
    def seed_checkpoint(self) -> Path:
        return self.folder / self.SEED_CHECKPOINT

    @property
    def cut(self) -> Path:
        return self.folder / self.CUT

    @property
    def aborted(self) -> Path:
        return self.folder / self.ABORTED

    @property
    def result(self) -> Path:
        return self.folder / self.RESULT

    @property
    def launch(self) -> Path:
        return self.folder / self.LAUNCH

    @property
    def started(self) -> Path:
        return self.folder / self.STARTED

    @property
    def exited(self) -> Path:
        return self.folder / self.EXITED

    def stdout(self, rank: int) -> Path:
        return self.folder / self.RANK_OUT.format(rank=rank)

    def stderr(self, rank: int) -> Path:
        return self.folder / self.RANK_ERR.format(rank=rank)

    def sidecar(self, rank: int) -> Path:
        return self.folder / self.SIDECAR.format(rank=rank)

    @property
    def preflight(self) -> Path:
        return self.folder / self.PREFLIGHT

    def node_log(self, node: str) -> Path:
        return self.folder / self.NODE_LOG.format(node=node)

    def node_logs(self) -> list[Path]:
        return sorted(self.folder.glob(self.NODE_LOG_GLOB))

    def time_limit_mark(self, rank: int | str) -> Path:
        return self.folder / self.TIME_LIMIT_MARK.format(rank=rank)

    def rank_logs(self) -> list[Path]:
        """rank-<r>.out then rank-<r>.err files, each kind in rank order."""
        return [p for pattern in self.RANK_LOG_GLOBS for p in sorted(self.folder.glob(pattern), key=_rank_order)]

    def rank_stderr(self) -> list[Path]:
        """rank-<r>.err files in rank order."""
        return sorted(self.folder.glob(self.RANK_ERR.format(rank="*")), key=_rank_order)

    def sidecars(self) -> list[Path]:
        return sorted(self.folder.glob(self.SIDECAR_GLOB), key=_rank_order)

    @property
    def submitit_folder(self) -> str:
        """What a submitit executor's `folder=` gets (`%j`: submitit puts the job id there)."""
        return str(self.folder / self.SUBMITIT / "%j")

    @property
    def submitit_flat_folder(self) -> str:
        """What a Slurm submitit executor's `folder=` gets: `.submitit` itself, created before sbatch. Under
        `.submitit/%j` submitit creates a job's folder only after sbatch returns (submitit/slurm/slurm.py:
        `_internal_process_submissions`, `move_temporary_file`), and Slurm does not create an output file's
        folder: a task that starts in that gap dies on "Could not open stdout file" (sacct FAILED)."""
        return str(self.folder / self.SUBMITIT)

    def submitit_logs(self, job_id: str | None = None) -> list[Path]:
        """submitit's logs in this folder, and with `job_id` those of an array under a parent's .submitit/."""
        files = [p for pattern in self.SUBMITIT_GLOBS for p in sorted(self.folder.glob(pattern), key=_rank_order)]
        if job_id:
            own = re.compile(rf"{re.escape(str(job_id))}_\d+_log\.(out|err)")
            for parent in list(self.folder.parents)[: self.SUBMITIT_LOOKUP_DEPTH]:
                found = [p for p in (parent / self.SUBMITIT).glob(f"{job_id}_*_log.*") if own.fullmatch(p.name)]
                files += sorted(found, key=_rank_order)
        return files

    @staticmethod
    def rank_of(path: str | os.PathLike) -> int | None:
        """`rank-12.out` (or `sidecar-rank-12.json`) -> 12."""
        m = _RANK_IN_NAME.search(Path(path).name)
        return int(m.group(1)) if m else None


def _rank_order(p: Path) -> tuple[int, str]:
    digits = "".join(c if c.isdigit() else " " for c in p.name).split()
    return (int(digits[0]) if digits else -1, p.name)


@dataclass(frozen=True)
class CheckpointPaths:
    """Megatron's checkpoint folder (--save / --load DIR), as the twin writes and reads it.

    Megatron's names: the tracker file holds the latest saved iteration, each save is `iter_NNNNNNN/`
    (megatron/training/checkpointing.py: get_checkpoint_tracker_filename, get_checkpoint_name). The twin
    "saves" one marker file there (simulated) standing for the checkpoint's shards."""

    folder: Path

    TRACKER = "latest_checkpointed_iteration.txt"
    ITERATION = "iter_{it:07d}"
    TWIN_MARKER = "twin-checkpoint.json"

    def __init__(self, folder: str | os.PathLike) -> None:
        object.__setattr__(self, "folder", Path(folder))

    @property
    def tracker(self) -> Path:
        return self.folder / self.TRACKER

    def iteration(self, it: int) -> Path:
        return self.folder / self.ITERATION.format(it=it)

    def twin_marker(self, it: int) -> Path:
        return self.iteration(it) / self.TWIN_MARKER


def atomic_write(path: str | os.PathLike, data: str | bytes, *, fsync: bool = True) -> Path:
    """Write `data` to `path` so that a reader sees the old file or the whole new one, never a part.

    A temporary file in the same folder (unique per process and thread: every rank may write at once) is
    written, flushed to disk (fsync) and renamed over `path`; then the folder entry is synced. If anything
    fails the temporary file is removed and `path` is left as it was. Text is written as UTF-8."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(blob)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if fsync:
        _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable; a file system that cannot sync a folder (some network mounts) is let be."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


# A write that fails because of the file system, not the code: one error line naming the folder, no traceback.
_FULL = {
    errno.ENOSPC: ("no space left on {where}", "free space there"),
    errno.EDQUOT: ("the disk quota is exceeded on {where}", "free space there or raise the quota"),
    errno.EROFS: ("{where} is on a read-only file system", "mount it read-write"),
}


def disk_full(exc: BaseException, *, folder: str | os.PathLike[str] = "", fix: str = "") -> DiskFull | None:
    """The one line for a write the file system refused for want of room (a full disk, a quota, a read-only
    mount), wherever it happened (a job folder, a result, a report, an export); None for any other error. Where:
    the folder of the file being written (`exc.filename`), else `folder`. `fix`: a further way out."""
    if not isinstance(exc, OSError) or exc.errno not in _FULL:
        return None
    where = Path(exc.filename).parent if exc.filename else Path(folder or ".").resolve()
    what, how = _FULL[exc.errno]
    return DiskFull(what.format(where=where) + f" ({exc.strerror})", how + (f" ({fix})" if fix else ""))


@contextlib.contextmanager
def folder_writes(folder: str | os.PathLike[str], resume: str) -> Iterator[None]:
    """Writes under a job folder: a full disk (or quota, a read-only mount) is a DiskFull naming the folder and
    the fix (free space, then `resume`), instead of an OSError traceback. Nothing is lost: the ledger's launch
    intents let `resume` adopt or relaunch whatever was or was not submitted."""
    try:
        yield
    except OSError as exc:
        full = disk_full(exc, folder=folder, fix="or set cluster.folder elsewhere")
        if full is None:
            raise
        full.again = f"`{resume}`"
        raise full from None


NAME_MAX = 100  # a sweep name names folders and Slurm jobs
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(name: str, *, source: str = "sweep.name") -> str:
    """`name` if it is a safe sweep name (the one rule: sweep, resume, run-one, report, ledger ingest), else
    UserError naming the rule (nothing has been written yet)."""
    if len(name) > NAME_MAX:
        raise UserError(f"{source} is {len(name)} characters long; use at most {NAME_MAX}, e.g. sweep.name=1k-try2")
    if not _NAME.fullmatch(name):
        raise UserError(
            f"{source} {name!r} is not a safe name: use letters, digits, '.', '_' and '-', starting with a "
            "letter or digit (it names folders and Slurm jobs), e.g. sweep.name=1k-try2"
        )
    return name
