"""Planned candidate -> JobSpec (what a compute node runs) and its Slurm time limit.

Why separate from the launcher: the spec is the contract between the orchestrator and the job
(`jobs/spec.py`); building it needs the planner's argv and FLOP models, the launcher only needs
the result. Pure apart from reading the config: no submitit, no files.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional

from jobs.spec import JobSpec
from orchestrator.plan import argv as plan_argv
from orchestrator.plan import flops as plan_flops
from orchestrator.plan.planner import Planned
from orchestrator.schema import ClusterConfig, RootConfig

TIME_SAFETY = 2.0  # the measured step may be this much slower than predicted before Slurm cuts a good run


def job_dir(cfg: RootConfig, sweep: str, candidate_key: str, attempt: int) -> Path:
    """`<cluster.folder>/<sweep>/<candidate_key>/attempt-<n>/` (DESIGN.md, Job folder)."""
    return Path(cfg.cluster.folder).expanduser().resolve() / sweep / candidate_key / f"attempt-{attempt}"


def build_spec(cfg: RootConfig, planned: Planned, *, sweep: str, attempt: int,
               job_dir: Optional[Path | str] = None) -> JobSpec:
    """The JobSpec for one attempt: Megatron flags for warmup + measure iterations, env, FLOPs."""
    stage = cfg.stage
    if stage is None:
        raise ValueError("build_spec needs a stage")
    layout = planned.layout
    pred = planned.prediction
    train_iters = stage.warmup_iters + stage.measure_iters
    argv = plan_argv.megatron_argv(cfg.model, stage, layout, layer_pattern=pred.layer_pattern,
                                   train_iters=train_iters, mock_data=cfg.workload.mock_data)
    fl = plan_flops.step_flops(cfg.model, stage, layout)
    env = {**{k: str(v) for k, v in cfg.cluster.env.items()}, **{k: str(v) for k, v in cfg.workload.env.items()}}
    folder = Path(job_dir) if job_dir is not None else globals()["job_dir"](cfg, sweep, planned.key, attempt)
    return JobSpec(
        sweep=sweep,
        candidate_key=planned.key,
        attempt=attempt,
        layout=layout.to_dict(),
        model=cfg.model,
        stage=stage,
        hardware=cfg.hardware,
        workload=cfg.workload,
        env=env,
        argv=[str(a) for a in argv],
        job_dir=str(folder),
        master_port=cfg.cluster.master_port,
        n_gpus=stage.gpus,
        gpus_per_node=stage.gpus_per_node,
        model_flops_per_step=float(fl.model_flops),
        recompute_flops_per_step=float(fl.recompute_flops),
        predicted=_prediction_dict(pred),
    )


def _prediction_dict(pred) -> dict:
    d = dataclasses.asdict(pred)
    d["memory_by_stage"] = list(d.get("memory_by_stage") or ())
    return d


def time_limit_min(spec: JobSpec, cluster: ClusterConfig, *, safety: float = TIME_SAFETY) -> int:
    """Slurm --time: (warmup + measure) x predicted step time x safety + time_margin_min (start-up,
    checkpoint-free init, teardown), never below min_time_min."""
    iters = spec.stage.warmup_iters + spec.stage.measure_iters
    step_s = float(spec.predicted.get("step_time_s") or 0.0)
    minutes = iters * step_s * safety / 60.0 + cluster.time_margin_min
    return max(int(cluster.min_time_min), int(math.ceil(minutes)))
