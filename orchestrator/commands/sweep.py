"""`sweep +stage=STAGE [cluster=auto|slurm|local] [sweep.name=NAME]`: run (or continue) a ledger-driven sweep.

Rounds of plan -> select within budget -> submit -> poll -> ingest -> decide until the budget (runs,
GPU-hours, rounds) is spent or the policy converges. A sweep with an existing name is continued.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import TYPE_CHECKING

from orchestrator.config import compose, redact, runnable_fix, stage_or_error
from orchestrator.core import metrics
from orchestrator.core.errors import UserError
from orchestrator.core.metrics import STEP_P50
from orchestrator.plan.planner import plan

if TYPE_CHECKING:  # the driver (SQLAlchemy, the launchers) is imported by run(): `--help` stays light
    from orchestrator.sweep import Options

NAME = "sweep"
HELP = "Run (or continue) a ledger-driven sweep of parallel layouts: +stage=1k cluster=auto|slurm|local."


def add_arguments(parser) -> None:
    parser.add_argument(
        "--retry",
        action="append",
        default=[],
        metavar="CLASS",
        help="also resubmit this deterministic failure class, e.g. --retry oom (repeatable)",
    )
    parser.add_argument("--plain", action="store_true", help="plain lines even on a terminal (no live table)")
    parser.add_argument(
        "--max-wall",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop driving after SECONDS (jobs keep running; `resume` continues)",
    )
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON at the end")
    parser.add_argument(
        "--skip-preflight",
        action="store_true",
        help="real workloads: launch without the preflight job (the skipping is recorded in the ledger)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config, the budget (GPU-hours, cluster-days), round 0's layouts with their "
        "predicted cost and the whole sweep's simulated price (stage.budget.price_samples); launch nothing, write "
        "nothing",
    )
    parser.add_argument(
        "--cfg",
        nargs="?",
        const="job",
        choices=("job",),
        default=None,
        help="print the resolved config as YAML (Hydra's --cfg job) and exit",
    )


def options(args) -> Options:
    from orchestrator.sweep import Options

    return Options(
        retry={c.upper() for c in args.retry},
        max_wall_s=args.max_wall,
        skip_preflight=bool(getattr(args, "skip_preflight", False)),
    )


def exit_status(outcome) -> int:
    """1 when the sweep stopped without one measured candidate (every job failed, or it was cancelled first):
    a script must not read "done" from it. A --max-wall stop (reason `wall limit ...`) is unfinished: 0."""
    if outcome.best is not None or outcome.reason.startswith("wall"):
        return 0
    print(
        f"sweep {outcome.sweep} measured nothing ({outcome.spent.attempts} attempt(s)): see each job's failure "
        f"with `python -m orchestrator status {outcome.sweep}`",
        file=sys.stderr,
    )
    return 1


def _ledger_args(overrides) -> str:
    """The ledger overrides a follow-up command needs to find this sweep (`ledger=postgres`, `ledger.url=...`)."""
    keep = [o for o in overrides if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == "ledger"]
    return "".join(" " + shlex.quote(redact(o, overrides)) for o in keep)


def resume_command(name: str, overrides) -> str:
    """The command that continues sweep `name`, with the ledger overrides this command was given: said after a
    stop from outside (a signal, a locked ledger, a full disk) and by a new sweep's warning about another sweep
    of its stage."""
    return f"`python -m orchestrator resume {name}{_ledger_args(overrides)}`"


def next_steps(outcome, cfg, overrides) -> dict[str, str]:
    """What to do after a sweep: the command that prints the best layout's Megatron flags, the report
    command, and where the job folders are (the best attempt's, else the configured cluster.folder)."""
    from pathlib import Path

    from orchestrator.ledger.ledger import Ledger

    folder = Path(cfg.cluster.folder).resolve() / outcome.sweep
    with Ledger.from_config(cfg.ledger) as ledger:
        cand = (outcome.best or {}).get("candidate_id")
        atts = ledger.attempts(cand) if cand is not None else []
        if atts and atts[-1].job_dir:  # <folder>/<sweep>/<key>/attempt-<n>: where the jobs really went
            folder = Path(atts[-1].job_dir).parent.parent
    led = _ledger_args(overrides)
    steps = {
        "report": f"python -m orchestrator report {outcome.sweep}{led}",
        "status": f"python -m orchestrator status {outcome.sweep}{led}",
        "job_folders": f"{folder}/",
    }
    if outcome.best is not None:
        steps["flags"] = f"python -m orchestrator best --sweep {outcome.sweep} --flags{led}"
    return steps


def report(outcome, args, cfg=None, overrides=()) -> int:
    from orchestrator import history
    from orchestrator.sweep.view import folded_command

    steps = next_steps(outcome, cfg, overrides) if cfg is not None else {}
    if args.json:
        print(
            json.dumps(
                {
                    "sweep": outcome.sweep,
                    "reason": outcome.reason,
                    "rounds": outcome.rounds,
                    "best": outcome.best,
                    "runs": outcome.spent.runs,
                    "attempts": outcome.spent.attempts,
                    "gpu_hours": outcome.spent.gpu_hours,
                    "gpu_hours_by_fidelity": outcome.spent.by_fidelity,
                    "simulated": outcome.spent.simulated,
                    "next": steps,
                },
                indent=2,
            )
        )
        return exit_status(outcome)
    sim = " (simulated)" if outcome.spent.simulated else ""
    print(f"sweep {outcome.sweep} stopped: {outcome.reason}")
    print(
        f"  rounds {outcome.rounds}, runs {outcome.spent.runs}, attempts {outcome.spent.attempts}, "
        f"{outcome.spent.gpu_hours:.1f} GPU-hours{sim}" + history.fidelity_split(outcome.spent.by_fidelity)
    )
    if outcome.best:
        b = outcome.best
        how = "measured, simulated" if outcome.spent.simulated else "measured"
        print(f"best layout ({how}): {b['layout']}  step p50 {metrics.text(STEP_P50, b[STEP_P50])}")
    if steps:
        print("next:")
        if "flags" in steps:
            print(*folded_command("  its Megatron flags  ", steps["flags"]), sep="\n")
        else:
            print(*folded_command("  why nothing was measured  ", steps["status"]), sep="\n")
        print(*folded_command("  the report          ", steps["report"]), sep="\n")
        print(f"  job folders         {steps['job_folders']}")
    return exit_status(outcome)


def sources_of(cfg, overrides) -> tuple:
    """The configs and YAML of the stages `cfg`'s stage promotes from, root first (16k: 1k, then 8k), with this
    command's other overrides (as `sweep +stage=1k ...` before `sweep +stage=8k ...`): the whole sweep's price
    simulates them first. Empty when the stage promotes from none, or a config of the chain does not compose or
    promotes in a circle (the price then runs the stage on its own)."""
    keep = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != "stage"]
    chain: list = []
    seen = {cfg.required_stage().name}
    src = cfg.required_stage().promotes_from
    while src:
        if src in seen:
            return ()
        try:
            composed = compose([*keep, f"+stage={src}"])
        except Exception:  # noqa: BLE001 - an override the source stage refuses: priced standalone
            return ()
        chain.insert(0, (composed.cfg, composed.to_yaml()))
        seen.add(src)
        src = composed.cfg.required_stage().promotes_from
    return tuple(chain)


def run(args, overrides) -> int:
    from orchestrator.runspec import check_workload
    from orchestrator.sweep import run_sweep
    from orchestrator.sweep.preview import preview
    from orchestrator.sweep.setup import default_name
    from orchestrator.sweep.view import View

    composed = compose(overrides, require_stage=not getattr(args, "cfg", None), command=NAME)
    if getattr(args, "cfg", None):
        print(composed.to_yaml(), end="")
        return 0
    cfg = composed.cfg
    # An impossible stage is refused before anything is written to the ledger.
    stage = stage_or_error(composed)
    res = plan(cfg.model, cfg.hardware, stage, workload=cfg.workload.name, recipe=cfg.workload.recipe)
    if not res.candidates:
        raise UserError(res.why_empty(stage))
    check_workload(cfg)  # a command that cannot start here (preflight-lite on cluster=local) is refused first
    default_name(cfg)  # an unsafe sweep name too: a refused sweep prints nothing but its error line
    # The price before the spend: a dry run prints it and stops; a sweep prints round 0's block once its ledger
    # opens, and the whole sweep's simulated price once it knows the sweep is new and the cluster can run it.
    n = stage.budget.price_samples
    dry = getattr(args, "dry_run", False)
    pv = preview(cfg, composed.to_yaml(), sources_of(cfg, overrides) if n and dry else (), samples=n if dry else 0)
    if dry:
        from orchestrator.sweep.view import folded

        print("\n".join(part for line in pv.lines() for part in folded(line)))  # the lines a sweep starts with
        print("dry run: nothing launched, nothing written (drop --dry-run to run the sweep)")
        return 0

    def whole():
        from orchestrator.sweep.price import price

        return price(cfg, composed.to_yaml(), sources_of(cfg, overrides), samples=n) if n else None

    view = View(live=False) if args.plain else View()
    outcome = run_sweep(
        composed.cfg,
        composed.to_yaml(),
        options=options(args),
        view=view,
        preface=pv.lines(),
        resume=lambda name: resume_command(name, overrides),
        price=whole,
        runnable=lambda: runnable_fix(NAME, overrides),
    )
    return report(outcome, args, cfg, overrides)
