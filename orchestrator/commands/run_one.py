"""`run-one`: plan a stage, launch ONE candidate, wait, collect, print its structured result.

Why a command of its own: it is the smallest end-to-end check of a cluster + workload pairing
(does the job start, do its logs parse, do the numbers look sane) before a sweep spends budget.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from orchestrator.config import compose, stage_or_error
from orchestrator.core.errors import UserError

NAME = "run-one"
HELP = "Launch one planned candidate (by index), wait for it, and print its measured result."


def add_arguments(parser) -> None:
    parser.add_argument(
        "--candidate",
        type=int,
        default=0,
        metavar="INDEX",
        help="candidate index in the planner's order (the `candidate` column of `plan`; 0 = predicted fastest)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--folder", default=None, metavar="DIR", help="root of the job folders (default: cluster.folder)"
    )
    parser.add_argument("--attempt", type=int, default=None, help="attempt number (default: next free)")


def run(args, overrides) -> int:
    from orchestrator.core.paths import JobPaths, check_name
    from orchestrator.evidence.collect import collect
    from orchestrator.plan import planner
    from orchestrator.runspec import attempt_dir, build_spec, check_workload, launch_task

    overrides = list(overrides)
    if args.folder:
        overrides.append(f"cluster.folder={Path(args.folder).resolve()}")
    composed = compose(overrides, require_stage=True, command=NAME)
    cfg, stage = composed.cfg, stage_or_error(composed)
    planned_all = planner.plan(
        cfg.model, cfg.hardware, stage, workload=cfg.workload.name, recipe=cfg.workload.recipe
    ).candidates
    if not planned_all:
        raise UserError(
            f"stage {stage.name} has no feasible candidate: see `python -m orchestrator plan "
            f"+stage={stage.name} --show-rejected`"
        )
    if not 0 <= args.candidate < len(planned_all):
        raise UserError(
            f"--candidate {args.candidate} is out of range: stage {stage.name} has "
            f"{len(planned_all)} feasible candidates (0..{len(planned_all) - 1})"
        )
    planned = planned_all[args.candidate]
    sweep = check_name(cfg.sweep.name or f"run-one-{stage.name}")
    check_workload(cfg)
    attempt = args.attempt or _next_attempt(attempt_dir(cfg, sweep, planned.key, 1).parent)
    folder = attempt_dir(cfg, sweep, planned.key, attempt)
    spec = build_spec(cfg, planned, sweep=sweep, attempt=attempt, job_dir=folder)
    spec.save(JobPaths(folder).spec)
    state, job_id, kind = _launch_and_wait(cfg, spec, launch_task(cfg, spec))
    result = collect(folder, slurm_state=state.state, exit_code=state.exit_code, job_id=job_id)
    summary = summarize(args.candidate, planned, spec, result, job_id=job_id, cluster=kind)
    if args.format == "json":
        print(json.dumps(summary, indent=2, default=str))
    else:
        print_table(summary)
    return 0 if result.ok else 1


def _next_attempt(candidate_dir: Path) -> int:
    taken = [int(p.name.split("-", 1)[1]) for p in candidate_dir.glob("attempt-*") if p.name.split("-", 1)[1].isdigit()]
    return max(taken, default=0) + 1


def _launch_and_wait(cfg, spec, task):
    """Submit through orchestrator.launch and poll until the job is terminal; Ctrl-C cancels it."""
    from orchestrator.launch.auto import make_launcher

    launcher, reason = make_launcher(cfg.job_cluster())
    print(
        f"launching candidate {spec.candidate_key} on {launcher.kind} ({reason}); job folder {spec.job_dir}",
        file=sys.stderr,
    )
    sub = launcher.submit([task])[0]
    interval = min(1.0, cfg.cluster.poll_interval_s)
    try:
        while True:
            state = launcher.poll([sub.job_id]).get(sub.job_id)
            if state is not None and state.terminal:
                return state, sub.job_id, launcher.kind
            time.sleep(interval)
            interval = min(cfg.cluster.poll_interval_s, interval * 1.5)
    except KeyboardInterrupt:
        launcher.cancel([sub.job_id])
        print(f"cancelled job {sub.job_id}; its folder stays at {spec.job_dir}", file=sys.stderr)
        raise


def summarize(index: int, planned, spec, result, *, job_id=None, cluster=None) -> dict:
    """The fields a user checks first, plus the full JobResult under "result"."""
    pred = planned.prediction
    peak = result.peak_reserved_gb if result.peak_reserved_gb is not None else result.peak_allocated_gb
    return {
        "simulated": bool(result.simulated),
        "ok": bool(result.ok),
        "failure_class": result.failure_class,
        "failure_detail": result.failure_detail,
        "candidate": index,
        "candidate_key": planned.key,
        "layout": planned.layout.short(),
        "job_id": job_id,
        "cluster": cluster,
        "job_dir": spec.job_dir,
        "N": spec.n_gpus,
        "D_a": pred.d_a,
        "D_e": pred.d_e,
        "m": pred.m,
        "bubble": pred.bubble,
        "predicted_step_s": pred.step_time_s,
        "predicted_memory_gb": pred.memory_gb,
        "measure_iters": result.measure_iters,
        "partial": result.partial,
        "step_p50_s": result.step_p50_s,
        "step_p95_s": result.step_p95_s,
        "step_p99_s": result.step_p99_s,
        "tokens_per_s_per_gpu": result.tokens_per_s_per_gpu,
        "tflops_per_gpu": result.tflops_per_gpu,
        "mfu": result.mfu,
        "mfu_peak": result.mfu_peak,
        "heaviest_rank": result.heaviest_rank,
        "heaviest_pp_stage": result.heaviest_pp_stage,
        "peak_memory_gb": peak,  # decimal GB, comparable to predicted_memory_gb
        "token_drop_fraction": result.token_drop_fraction,
        "hot_expert_ratio": result.hot_expert_ratio,
        "result": result.to_dict(),
    }


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def print_table(s: dict) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    console = Console()
    if s["simulated"]:
        console.print(
            Panel(
                "[bold yellow]SIMULATED[/] - twin workload: every number below is simulated, not measured on GPUs",
                style="yellow",
            )
        )
    t = Table(title=f"run-one: candidate {s['candidate']} ({s['layout']})", show_header=True)
    t.add_column("field")
    t.add_column("predicted", justify="right")
    t.add_column("measured" + (" (SIMULATED)" if s["simulated"] else ""), justify="right")
    t.add_row("status", "", "ok" if s["ok"] else f"[red]{s['failure_class']}[/]")
    t.add_row("step time p50 (s)", _fmt(s["predicted_step_s"], ".3f"), _fmt(s["step_p50_s"], ".3f"))
    t.add_row("step time p95 / p99 (s)", "", f"{_fmt(s['step_p95_s'], '.3f')} / {_fmt(s['step_p99_s'], '.3f')}")
    t.add_row("tokens/s/GPU", "", _fmt(s["tokens_per_s_per_gpu"], ",.0f"))
    t.add_row("MFU", "", _fmt(s["mfu"], ".1%"))
    t.add_row("heaviest rank (PP stage)", "", f"{_fmt(s['heaviest_rank'])} ({_fmt(s['heaviest_pp_stage'])})")
    t.add_row("peak memory (GB)", _fmt(s["predicted_memory_gb"], ".1f"), _fmt(s["peak_memory_gb"], ".1f"))
    t.add_row("token drop", "", _fmt(s["token_drop_fraction"], ".2%"))
    t.add_row("measured iterations", "", f"{s['measure_iters']}{' (partial)' if s['partial'] else ''}")
    t.add_row("D_a / D_e / m / bubble", f"{s['D_a']} / {s['D_e']} / {s['m']} / {s['bubble']:.3f}", "")
    console.print(t)
    if s["failure_detail"]:
        console.print(f"[red]evidence:[/] {s['failure_detail']}")
    console.print(f"job folder: {s['job_dir']}  (job {s['job_id']} on {s['cluster']})")
