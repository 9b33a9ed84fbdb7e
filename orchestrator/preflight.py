"""Preflight: fail in one minute on one node, not after hours on 128.

Two halves. The job half (orchestrator/job/preflight.py) runs as a 1-node job through the same launcher as every
candidate (inside the container when one is set): Python, torch + CUDA, GPUs, NCCL, Transformer Engine,
the dev-branch V4 modules, the kernels the stage's space needs, and Megatron's own verdict on every
candidate the planner keeps. This half asks the launcher, through the registry (orchestrator/launch/auto), what
its cluster lets the stage run (on Slurm: sinfo and sacctmgr on the login node, the partition, account and QoS:
MaxTime against each candidate's time limit, GPUs and CPUs per node, node count) and checks its settings (the
container image). A missing answer is a warning row, never a crash. Candidates Megatron rejects, or that ask
for more time than the partition allows, are `rejected`: the sweep never launches them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.core.paths import JobPaths
from orchestrator.core.schema import ClusterConfig, RootConfig, StageConfig
from orchestrator.job import preflight as job
from orchestrator.job.preflight import Check, CheckStatus, PreflightReport, PreflightRequest
from orchestrator.launch.registry import Answer
from orchestrator.plan import probe as plan_probe

JOB_TIME_MIN = 15  # the preflight job: imports + one validate_args per candidate
# How long the job may wait in the queue (on top of its time limit) before preflight gives up and cancels it:
# a busy partition delays it, a job that can never start is caught sooner (the launcher's checks).
MAX_PENDING_S = 1800.0


@dataclass
class Outcome:
    checks: list[Check]
    rejected: dict[str, str] = field(default_factory=dict)  # candidate key -> why it is never launched
    folder: str = ""
    job_id: str | None = None
    megatron: dict = field(default_factory=dict)  # the node's checkout: commit, tested commit, path
    # what the sweep records from the launchers' settings rows, provenance part -> value (settings_checks: on
    # Slurm `container`, cluster.slurm.container.image and its digest)
    recorded: dict[str, Any] = field(default_factory=dict)
    lifted: list[str] = field(default_factory=list)  # rules whose Megatron fix the checkout carries
    static: int = 0  # the last `static` checks are the rows from this host (the launcher's), printed first
    refusal: str = ""  # the stage's jobs can never run on the partition: its size and the fix (one line)

    @property
    def ok(self) -> bool:
        return not any(c.status is CheckStatus.FAIL for c in self.checks)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "checks": [
                {"name": c.name, "status": str(c.status), "detail": c.detail, "fix": c.fix} for c in self.checks
            ],
            "rejected": self.rejected,
            "folder": self.folder,
            "job_id": self.job_id,
            "megatron": self.megatron,
            "recorded": self.recorded,
            "lifted": self.lifted,
            "refusal": self.refusal,
        }


def candidates(cfg: RootConfig) -> tuple[PreflightRequest, dict[str, int]]:
    """The job's request (every candidate the planner keeps, with its argv) and each one's time limit."""
    import dataclasses

    from orchestrator.plan import planner, rules
    from orchestrator.runspec import build_spec, launch_task

    stage = cfg.stage
    assert stage is not None
    # every candidate the sweep could launch: also those a rule holds back until the node shows its fix
    superset = dataclasses.replace(stage, lifted_rules=sorted(rules.LIFTABLE))
    kept = planner.plan(
        cfg.model, cfg.hardware, superset, workload=cfg.workload.name, recipe=cfg.workload.recipe
    ).candidates
    mode = cfg.workload.probe_mode
    req = PreflightRequest(
        entry_script=_entry_script(cfg),
        gpus_per_node=stage.gpus_per_node,
        probe_mode=None if mode == plan_probe.OFF else mode,  # what the sweep's rank probes will install
    )
    limits: dict[str, int] = {}
    for p in kept:
        spec = build_spec(cfg, p, sweep="preflight", attempt=1, job_dir=Path(cfg.cluster.folder) / "preflight")
        argv = list(spec.argv) + list(cfg.workload.extra_args)
        req.candidates.append(job.CandidateArgv(key=p.key, argv=argv, world=spec.n_gpus, env=dict(spec.env)))
        limits[p.key] = launch_task(cfg, spec).time_min  # the limit its measurement launch would ask for
        backend = p.layout.flex_backend if p.layout.dispatcher == "flex" else None
        if backend and backend not in req.flex_backends:
            req.flex_backends.append(backend)
        req.cudnn_dsa = req.cudnn_dsa or _flag_value(argv, "--dsa-kernel-backend") == "cudnn"
        req.muon = req.muon or "muon" in (_flag_value(argv, "--optimizer") or "")
        req.packed_cp = req.packed_cp or (stage.packed_sequences and p.layout.cp > 1)
        fused = "--moe-router-fusion" in argv and _flag_value(argv, "--moe-router-score-function") == "sqrtsoftplus"
        req.router_fusion_sqrtsoftplus = req.router_fusion_sqrtsoftplus or fused
        req.csa = req.csa or "C" in (_flag_value(argv, "--hybrid-layer-pattern") or "")
    return req, limits


def _entry_script(cfg: RootConfig) -> str:
    cmd = list(cfg.workload.command)
    return next((c for c in reversed(cmd) if c.endswith(".py")), cmd[-1] if cmd else "")


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The last value given to `flag` (argparse: the last wins)."""
    value = None
    for a, b in zip(argv, [*argv[1:], ""]):
        if a == flag:
            value = b
    return value


# ------------------------------------------------------------------------------------------- rows from here
def _checks(answer: Answer) -> list[Check]:
    return [Check(r.name, CheckStatus(r.status), r.detail, r.fix) for r in answer.rows]


def cluster_checks(cluster: ClusterConfig, stage: StageConfig, limits: dict[str, int]) -> tuple[list[Check], dict]:
    """The launcher's rows about its cluster (on Slurm: partition, node shape, account and QoS, from sinfo and
    sacctmgr) and the candidates whose time limit it never allows (launch/auto `limits`: the backend
    cluster.kind names)."""
    from orchestrator.launch import auto

    answer = auto.limits(cluster, stage, limits)
    return _checks(answer), dict(answer.rejected)


def settings_checks(cluster: ClusterConfig) -> tuple[list[Check], dict[str, Any]]:
    """The launchers' rows about their own settings (on Slurm the container image and whether a digest pins it)
    and what the sweep records from them (provenance parts: `container`, its image and digest)."""
    from orchestrator.launch import auto

    answer = auto.settings(cluster)
    return _checks(answer), dict(answer.recorded)


# ------------------------------------------------------------------------------------------- the job
def run_job(
    cfg: RootConfig, req: PreflightRequest
) -> tuple[list[Check], dict[str, str], str, str | None, PreflightReport | None]:
    """Launch the 1-node preflight job, wait, read its report: (checks, rejected, folder, job id, report)."""
    from orchestrator.launch import LaunchError, LaunchTask
    from orchestrator.launch.auto import make_launcher

    stage = cfg.stage
    assert stage is not None
    cluster = cfg.job_cluster()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    folder = Path(cluster.folder).expanduser().resolve() / "preflight" / f"{stage.name}-{stamp}"
    launcher, _why = make_launcher(cluster)
    task = LaunchTask(
        fn=job.run,
        args=(req, str(folder)),
        n_gpus=stage.gpus_per_node,
        gpus_per_node=stage.gpus_per_node,
        name=f"preflight:{stage.name}",
        folder=str(folder),
        time_min=max(cluster.min_time_min, JOB_TIME_MIN),
    )
    try:
        sub = launcher.submit([task])[0]
    except LaunchError as exc:
        fix = "the Slurm rows above say which limit; fix cluster.* and run preflight again"
        return (
            [Check("preflight job", CheckStatus.FAIL, f"not submitted: {str(exc)[:300]}", fix)],
            {},
            str(folder),
            None,
            None,
        )
    interval = 0.2
    deadline = time.monotonic() + task.time_min * 60 + MAX_PENDING_S
    while True:
        try:
            state = launcher.poll([sub.job_id]).get(sub.job_id)
        except LaunchError as exc:  # pending for a reason that never clears: the launcher cancelled it
            return [Check("preflight job", CheckStatus.FAIL, str(exc)[:400], "")], {}, str(folder), sub.job_id, None
        if state is not None and state.terminal:
            break
        if time.monotonic() > deadline:
            launcher.cancel([sub.job_id])
            why = f"job {sub.job_id} still {state.state if state else 'unknown'} after {MAX_PENDING_S:.0f} s "
            why += "beyond its time limit: cancelled"
            fix = "see `squeue -j JOB -o %r` for why it waits; run preflight when the partition has a free node"
            return [Check("preflight job", CheckStatus.FAIL, why, fix)], {}, str(folder), sub.job_id, None
        time.sleep(interval)
        interval = min(cluster.poll_interval_s, interval * 1.5)
    if JobPaths(folder).preflight.exists():
        report = PreflightReport.load(folder)
        return report.checks, report.rejected, str(folder), sub.job_id, report
    logs = JobPaths(folder).submitit_logs(sub.job_id)
    tail = next(
        (
            p.read_text(errors="replace").strip().splitlines()[-1:]
            for p in logs
            if p.name.endswith(".err") and p.stat().st_size
        ),
        [""],
    )[0]
    check = Check(
        "preflight job",
        CheckStatus.FAIL,
        f"job {sub.job_id} {state.state} without a report: {tail[:200]}",
        "the task's Python (cluster.slurm.python) must import submitit and this project (mounted, on PYTHONPATH)",
    )
    return [check], {}, str(folder), sub.job_id, None


def stage_refusal(cfg: RootConfig) -> str | None:
    """One line when the stage's jobs can never run on the cluster (its size and the fix), else None."""
    if cfg.stage is None:
        return None
    from orchestrator.launch import auto

    return auto.refusal(cfg.job_cluster(), cfg.stage)


def run(cfg: RootConfig, *, on_static: Callable[[list[Check]], None] | None = None) -> Outcome:
    """Every row: the static rows from here first (handed to `on_static` before any job is submitted), then
    the job's rows. The job is not waited on when it can never run (the launcher refuses it before sbatch,
    or Slurm keeps it pending for a reason that never clears) nor beyond its time limit plus `MAX_PENDING_S`."""
    stage = cfg.stage
    assert stage is not None
    req, limits = candidates(cfg)
    cluster_rows, too_long = cluster_checks(cfg.job_cluster(), stage, limits)
    settings_rows, recorded = settings_checks(cfg.job_cluster())
    static = cluster_rows + settings_rows
    if on_static is not None:
        on_static(static)
    checks, rejected, folder, job_id, report = run_job(cfg, req)
    return Outcome(
        checks=checks + static,
        rejected={**too_long, **rejected},
        folder=folder,
        job_id=job_id,
        megatron=dict(report.megatron) if report else {},
        recorded=recorded,
        lifted=list(report.lifted) if report else [],
        static=len(static),
        refusal=stage_refusal(cfg) or "",
    )


def print_static(checks: list[Check]) -> None:
    """The rows this host answers (Slurm's limits, the container), before any job is submitted."""
    print_table(Outcome(checks=checks), title="preflight: the cluster's limits, checked from here (before the job)")


def print_table(outcome: Outcome, *, show_rejected: int = 10, title: str = "", skip_static: bool = False) -> None:
    """The table (rich), then the first rejected candidates with the reason (`skip_static`: without the rows
    `print_static` already showed)."""
    from rich.console import Console
    from rich.table import Table

    colour = {"pass": "green", "warn": "yellow", "fail": "red"}
    table = Table(title=title or f"preflight: {'PASS' if outcome.ok else 'FAIL'}  (job folder {outcome.folder})")
    for col in ("check", "result", "detail", "fix"):
        table.add_column(col, overflow="fold")
    rows = outcome.checks[: len(outcome.checks) - outcome.static] if skip_static else outcome.checks
    for c in rows:
        table.add_row(c.name, f"[{colour[str(c.status)]}]{c.status}[/]", c.detail, c.fix)
    console = Console(width=200)
    console.print(table)
    for key, why in list(outcome.rejected.items())[:show_rejected]:
        console.print(f"rejected {key[:10]}: {why}", markup=False, highlight=False)
    if len(outcome.rejected) > show_rejected:
        console.print(f"... and {len(outcome.rejected) - show_rejected} more rejected candidates")
