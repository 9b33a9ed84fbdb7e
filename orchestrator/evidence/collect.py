"""Job folder -> JobResult: parse every rank's output and sidecar, compute metrics, classify, save.

Why from the folder and not from the submitit return value: a job killed mid-way (time limit,
preemption, scancel, node failure) returns nothing, yet its rank files hold the iterations it did
finish and the evidence of why it stopped. Collect works the same for a finished job, a partial one
and one that never started (NO_OUTPUT), and can be re-run at any time (result.json is replaced
atomically).

Effective throughput: every measured job gets Q_effective (orchestrator.evidence.effective) from its steady tokens/s,
its N and the spec's EffectiveConfig, with save / restore seconds from the `save-checkpoint` /
`load-checkpoint` timers when the job logged them, else the config's defaults. Those timers are read
from every timer block, not only the measured window's: Megatron logs `load-checkpoint` before the
first iteration. A restore job (role long-run-restore) that loaded nothing is not a measurement.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.failures import Failure
from orchestrator.core.paths import JobPaths, atomic_write
from orchestrator.core.result import JobResult
from orchestrator.core.spec import JobSpec
from orchestrator.core.states import AttemptRole
from orchestrator.evidence import metrics as metrics_mod
from orchestrator.evidence.classify import PROBE_ONLY, as_probe, classify
from orchestrator.evidence.effective import effective_throughput
from orchestrator.evidence.keep import Keep
from orchestrator.evidence.parse import parse_file
from orchestrator.evidence.records import ParsedLog
from orchestrator.launch.base import read_aborted
from orchestrator.plan import ranks
from orchestrator.plan.flops import peak_label, peak_tflops

SAVE_TIMER, LOAD_TIMER = "save-checkpoint", "load-checkpoint"  # Megatron's names (log level 0)
MISSING_CKPT = b"could not find the metadata file"  # checkpointing.py's warning for an empty --load dir
STDERR_LINES = 5  # of a job's stderr, added to a failure no log line explains


@dataclass
class JobFolder:
    """What a job folder holds, parsed."""

    path: Path
    spec: JobSpec | None
    logs: list[ParsedLog] = field(default_factory=list)
    sidecars: list[dict] = field(default_factory=list)
    sidecar_paths: list[str] = field(default_factory=list)

    @property
    def simulated(self) -> bool:
        return bool(
            (self.spec is not None and self.spec.workload.simulated)
            or any(log.simulated for log in self.logs)
            or any(sc.get("simulated") for sc in self.sidecars)
        )


def read_folder(
    job_dir: str | os.PathLike, job_id: str | None = None, window: tuple[int, int] | None = None
) -> JobFolder:
    """Parse the folder's files, keeping of each what the metrics read (orchestrator.evidence.keep): the window
    (`window`, else the spec's) with its warm-up's iteration lines and the checkpoint timers, so a log of any
    size parses in flat memory."""
    paths = JobPaths(job_dir)
    spec = JobSpec.load(paths.spec) if paths.spec.exists() else None
    files = paths.rank_logs() + paths.node_logs() + paths.submitit_logs(job_id)
    sidecars, used = metrics_mod.load_sidecars(paths.sidecars())
    window = window or (spec.window if spec is not None else None)
    keep = Keep(window=window, timers=(SAVE_TIMER, LOAD_TIMER), warmup=True)
    return JobFolder(
        path=paths.folder,
        spec=spec,
        logs=[parse_file(p, keep=keep) for p in dict.fromkeys(files) if p.is_file()],
        sidecars=sidecars,
        sidecar_paths=used,
    )


def iteration_times(job_dir: str | os.PathLike, upto: int) -> list[float]:
    """Seconds of iterations 1..upto as far as a (running) job's logs have them, in order, stopping at the first
    one missing: what the early cut (orchestrator/sweep/cutoff.py) reads while the job runs, every poll. Only the
    evidence ranks' own files: Megatron's iteration line ("elapsed time per iteration (ms)", printed by
    print_rank_last: dev megatron/training/training.py:3574, 3653) is the last rank's, an evidence rank
    (plan/ranks.evidence_ranks), and a 1k job's node logs (every other rank's output) are not read each poll."""
    keep = Keep(window=(0, upto))
    logs = [parse_file(p, keep=keep) for p in JobPaths(job_dir).rank_logs() if p.is_file()]
    by_it = {r.iteration: r.elapsed_ms for log in logs for r in log.iterations}
    out = []
    for i in range(1, upto + 1):
        if i not in by_it:
            break
        out.append(by_it[i] / 1000.0)
    return out


def as_cut(result: JobResult, mark: dict) -> None:
    """A job the sweep stopped at its early cut is the measurement of the iterations the cut read, not a failure:
    its cancel (CANCELLED, a signal's exit) is the sweep's own doing. Any other failure stands, and so does a
    cut whose iterations the logs no longer hold in full (not a measurement)."""
    _, n = cut_window(mark) or (0, 0)
    if result.failure_class not in (None, Failure.CANCELLED) or result.measure_iters < n:
        return
    result.ok, result.failure_class, result.partial = True, None, False
    result.failure_detail, result.nccl_group = "", None  # the cancel's own line: the sweep's cut event says why


def read_cut(job_dir: str | os.PathLike) -> dict | None:
    """The sweep's mark that it stopped this job at its early cut (JobPaths.CUT), or None."""
    path = JobPaths(job_dir).cut
    try:
        mark = json.loads(path.read_text())
        return mark if isinstance(mark, dict) and {"warmup_iters", "measure_iters"} <= set(mark) else None
    except (OSError, ValueError):
        return None


def cut_window(mark: dict | None) -> tuple[int, int] | None:
    """(warm-up, measured iterations) of a cut job's result, as its mark states them (the iterations its cut read:
    core/decision.CutLine.window_at, written by sweep/cutoff.mark)."""
    return (int(mark["warmup_iters"]), int(mark["measure_iters"])) if mark else None


def pp_of_rank(spec: JobSpec) -> Callable[[int], int | None]:
    """Rank -> pipeline stage in Megatron's rank order (PP is the outermost dense axis by default,
    between TP-CP and DP with --use-tp-pp-dp-mapping)."""
    lay = spec.knobs
    n = max(1, spec.n_gpus)

    def stage(rank: int) -> int | None:
        try:
            return ranks.coords(lay, n, rank)["pp"]
        except ValueError:  # outside the world, or a layout N does not divide
            return None

    return stage


def collect(
    job_dir: str | os.PathLike,
    *,
    slurm_state: str | None = None,
    exit_code: int | None = None,
    job_id: str | None = None,
    lost: bool = False,
) -> JobResult:
    """Build the JobResult of one attempt from its folder and write result.json (tmp + rename).
    `job_id` also finds submitit's logs of an array job under a parent folder's .submitit/.
    `lost`: the launcher lost the job (no process, no exit status, no result of its own: killed with its
    orchestrator). A window it did not finish is then LOST (retried), never a partial measurement or NO_OUTPUT."""
    cut = read_cut(job_dir)
    cut_win = cut_window(cut)
    folder = read_folder(job_dir, job_id, window=cut_win)
    spec = folder.spec
    result = JobResult(ok=False, simulated=folder.simulated, slurm_state=slurm_state, exit_code=exit_code)
    if spec is not None:
        stage, hw = spec.stage, spec.hardware
        warmup, measure = cut_win or spec.window  # the attempt's own window (or its cut's), not the stage's
        precision = str(spec.layout.get("precision") or "bf16")  # the layout's (a job from before the knob: bf16)
        metrics_mod.compute(
            folder.logs,
            folder.sidecars,
            warmup_iters=warmup,
            measure_iters=measure,
            seq_length=stage.seq_length,
            n_gpus=spec.n_gpus,
            global_batch=stage.global_batch,
            model_flops_per_step=spec.model_flops_per_step or None,
            recompute_flops_per_step=spec.recompute_flops_per_step or None,
            peak_tflops=peak_tflops(hw, precision),
            peak_label=peak_label(hw, precision),
            pp_of_rank=pp_of_rank(spec),
            result=result,
            sidecar_paths=folder.sidecar_paths,
        )
    else:  # no job.json: nothing to measure against; still classify what the folder holds
        result.log_paths = [log.path for log in folder.logs if log.path]
        result.sidecar_paths = list(folder.sidecar_paths)
    result.gpu_capacity_gb, result.gpu_capacity_source = metrics_mod.gpu_capacity(folder.logs, folder.sidecars)
    verdict = classify(folder.logs, slurm_state=slurm_state, exit_code=exit_code)
    if verdict.unexplained:
        verdict = verdict.with_stderr(stderr_head(JobPaths(folder.path)))
    verdict.apply(result)
    result.ok = result.ok and result.measure_iters > 0
    if cut is not None:
        as_cut(result, cut)
    if lost and result.failure_class in (None, Failure.NO_OUTPUT) and (result.partial or not result.ok):
        asked = spec.window[1] if spec is not None else "?"
        result.ok, result.failure_class = False, Failure.LOST
        result.failure_detail = (
            f"the job vanished after {result.measure_iters}/{asked} measured iterations with no exit status "
            "(killed with its orchestrator?): not a measurement, measured again"
        )
    if not result.ok and spec is not None and read_aborted(str(job_dir), spec.launch_token) is not None:
        result.failure_class = Failure.LOST  # the sweep's own cancel, however the job ended: measured again
        result.failure_detail = "cancelled by its sweep before its job id was recorded: no verdict, measured again"
    if spec is not None and spec.probe_ranks and result.failure_class in PROBE_ONLY:  # not the layout's failure
        as_probe(verdict).apply(result)
    if spec is not None:
        checkpoint_metrics(folder, spec, result)
    write_result(folder.path, result)
    return result


def stderr_head(paths: JobPaths, lines: int = STDERR_LINES) -> str:
    """The first non-blank lines of the first rank-<r>.err that has any (first 64 KB read), joined by ' | '."""
    for path in paths.rank_stderr():
        with open(path, "rb") as fh:
            head = fh.read(64 << 10).decode("utf-8", "replace")
        kept = [ln.strip() for ln in head.splitlines() if ln.strip()][:lines]
        if kept:
            return " | ".join(kept)
    return ""


def checkpoint_timers(logs) -> dict:
    """name -> [min, max] ms of the checkpoint timers over every block of every rank file."""
    out: dict = {}
    for log in logs:
        for block in log.timers:
            for name in (SAVE_TIMER, LOAD_TIMER):
                if name in block.timers:
                    lo, hi = block.timers[name]
                    los, his = out.setdefault(name, ([], []))
                    if lo is not None:
                        los.append(lo)
                    his.append(hi)
    return {name: [min(los) if los else None, max(his)] for name, (los, his) in out.items()}


def checkpoint_metrics(folder: JobFolder, spec: JobSpec, result: JobResult) -> None:
    """ckpt_save_s / ckpt_restore_s (slowest rank), tokens_per_s_after_restart, Q_effective."""
    timers = checkpoint_timers(folder.logs)
    result.timers_ms.update(timers)
    if SAVE_TIMER in timers:
        result.ckpt_save_s = timers[SAVE_TIMER][1] / 1000.0
    if LOAD_TIMER in timers:
        result.ckpt_restore_s = timers[LOAD_TIMER][1] / 1000.0
    if spec.role == AttemptRole.LONG_RUN_RESTORE:
        if LOAD_TIMER not in timers:
            result.ok = False
            why = _missing_checkpoint_line(folder) or result.failure_detail or "no load-checkpoint timer in the log"
            result.failure_class = result.failure_class or Failure.CRASH
            result.failure_detail = f"restore job loaded no checkpoint: {why}"
            return
        result.tokens_per_s_after_restart = result.tokens_per_s
    if result.ok and result.tokens_per_s:
        eff = spec.effective
        e = effective_throughput(
            result.tokens_per_s,
            n_gpus=spec.n_gpus,
            save_s=result.ckpt_save_s if result.ckpt_save_s is not None else eff.default_save_s,
            restore_s=result.ckpt_restore_s if result.ckpt_restore_s is not None else eff.default_restore_s,
            checkpoint_interval_s=eff.checkpoint_interval_s,
            interruption_rate_per_gpu_hour=eff.interruption_rate_per_gpu_hour,
            restart_overhead_s=eff.restart_overhead_s,
        )
        result.effective_fraction, result.q_effective = e.effective_fraction, e.q_effective


def _missing_checkpoint_line(folder: JobFolder) -> str:
    """Megatron's 'could not find the metadata file ...' warning, if a rank file has it (first 1 MB read)."""
    for path in JobPaths(folder.path).rank_logs():  # rank 0 prints it (print_rank_0): an evidence rank
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
        at = head.find(MISSING_CKPT)
        if at >= 0:
            start = head.rfind(b"\n", 0, at) + 1
            end = head.find(b"\n", at)
            return head[start : end if end >= 0 else None].decode("utf-8", "replace").strip()
    return ""


def write_result(job_dir: str | os.PathLike, result: JobResult) -> Path:
    return atomic_write(JobPaths(job_dir).result, json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))


def load_result(job_dir: str | os.PathLike) -> JobResult | None:
    path = JobPaths(job_dir).result
    return JobResult.from_dict(json.loads(path.read_text())) if path.exists() else None
