"""Job folder -> JobResult: parse every rank's output and sidecar, compute metrics, classify, save.

Why from the folder and not from the submitit return value: a job killed mid-way (time limit,
preemption, scancel, node failure) returns nothing, yet its rank files hold the iterations it did
finish and the evidence of why it stopped. Collect works the same for a finished job, a partial one
and one that never started (NO_OUTPUT), and can be re-run at any time (result.json is replaced
atomically).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

from jobs import metrics as metrics_mod
from jobs.classify import classify
from jobs.parse import ParsedLog, parse_file
from jobs.result import JobResult
from jobs.spec import SPEC_NAME, JobSpec
from orchestrator.plan.flops import peak_label, peak_tflops
from orchestrator.plan.layout import Layout

RESULT_NAME = "result.json"
RANK_GLOBS = ("rank-*.out", "rank-*.err")
# submitit's task logs (the job's own stdout/stderr): slurmstepd's `*** JOB ... CANCELLED ... ***` lands here.
SUBMITIT_GLOBS = ("*_log.out", "*_log.err", ".submitit/*/*_log.out", ".submitit/*/*_log.err")
SUBMITIT_LOOKUP_DEPTH = 4  # an array's .submitit/<job id>/ sits at the common parent of its job folders


@dataclass
class JobFolder:
    """What a job folder holds, parsed."""

    path: Path
    spec: Optional[JobSpec]
    logs: List[ParsedLog] = field(default_factory=list)
    sidecars: List[dict] = field(default_factory=list)
    sidecar_paths: List[str] = field(default_factory=list)

    @property
    def simulated(self) -> bool:
        return bool(
            (self.spec is not None and self.spec.workload.simulated)
            or any(log.simulated for log in self.logs)
            or any(sc.get("simulated") for sc in self.sidecars)
        )


def read_folder(job_dir: str | os.PathLike, job_id: Optional[str] = None) -> JobFolder:
    path = Path(job_dir)
    spec_path = path / SPEC_NAME
    spec = JobSpec.load(spec_path) if spec_path.exists() else None
    files: List[Path] = []
    for pattern in RANK_GLOBS + SUBMITIT_GLOBS:
        files += sorted(path.glob(pattern), key=_rank_order)
    if job_id:
        for parent in list(path.parents)[:SUBMITIT_LOOKUP_DEPTH]:
            files += sorted((parent / ".submitit" / str(job_id)).glob("*_log.*"), key=_rank_order)
    sidecars, used = metrics_mod.load_sidecars(sorted(path.glob("sidecar-rank-*.json"), key=_rank_order))
    return JobFolder(path=path, spec=spec, logs=[parse_file(p) for p in dict.fromkeys(files) if p.is_file()],
                     sidecars=sidecars, sidecar_paths=used)


def _rank_order(p: Path):
    digits = "".join(c if c.isdigit() else " " for c in p.name).split()
    return (int(digits[0]) if digits else -1, p.name)


def pp_of_rank(spec: JobSpec) -> Callable[[int], Optional[int]]:
    """Rank -> pipeline stage in Megatron's rank order (PP is the outermost dense axis by default,
    between TP-CP and DP with --use-tp-pp-dp-mapping)."""
    lay = Layout.from_dict(spec.layout)
    n = max(1, spec.n_gpus)

    def stage(rank: int) -> Optional[int]:
        if rank >= n or n % (lay.tp * lay.cp * lay.pp):
            return None
        if lay.use_tp_pp_dp_mapping:
            return (rank // (lay.tp * lay.cp)) % lay.pp
        return rank // (n // lay.pp)

    return stage


def collect(job_dir: str | os.PathLike, *, slurm_state: Optional[str] = None,
            exit_code: Optional[int] = None, job_id: Optional[str] = None) -> JobResult:
    """Build the JobResult of one attempt from its folder and write result.json (tmp + rename).
    `job_id` also finds submitit's logs of an array job under a parent folder's .submitit/."""
    folder = read_folder(job_dir, job_id)
    spec = folder.spec
    result = JobResult(ok=False, simulated=folder.simulated, slurm_state=slurm_state, exit_code=exit_code)
    if spec is not None:
        stage, hw = spec.stage, spec.hardware
        metrics_mod.compute(
            folder.logs, folder.sidecars, warmup_iters=stage.warmup_iters, measure_iters=stage.measure_iters,
            seq_length=stage.seq_length, n_gpus=spec.n_gpus, global_batch=stage.global_batch,
            model_flops_per_step=spec.model_flops_per_step or None,
            recompute_flops_per_step=spec.recompute_flops_per_step or None,
            peak_tflops=peak_tflops(hw, stage.precision), peak_label=peak_label(hw, stage.precision),
            pp_of_rank=pp_of_rank(spec), result=result, sidecar_paths=folder.sidecar_paths)
    else:  # no job.json: nothing to measure against; still classify what the folder holds
        result.log_paths = [log.path for log in folder.logs if log.path]
        result.sidecar_paths = list(folder.sidecar_paths)
    classify(folder.logs, slurm_state=slurm_state, exit_code=exit_code).apply(result)
    result.ok = result.ok and result.measure_iters > 0
    write_result(folder.path, result)
    return result


def write_result(job_dir: Path, result: JobResult) -> Path:
    path = Path(job_dir) / RESULT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
    return path


def load_result(job_dir: str | os.PathLike) -> Optional[JobResult]:
    path = Path(job_dir) / RESULT_NAME
    return JobResult.from_dict(json.loads(path.read_text())) if path.exists() else None
