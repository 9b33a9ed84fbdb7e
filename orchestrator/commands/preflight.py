"""`preflight +stage=1k [workload=megatron cluster=slurm]`: can this cluster run the stage with real Megatron?

Runs the checks of orchestrator/preflight.py (a 1-node job through the same launcher, plus Slurm's limits
from here) and prints one table, one row per check with its fix. Exit 0 when nothing failed, else 1.
"""

from __future__ import annotations

import json

from orchestrator.config import compose

NAME = "preflight"
HELP = "Check the cluster, container and Megatron checkout on one node before a sweep spends budget."


def add_arguments(parser) -> None:
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--show-rejected", type=int, default=10, metavar="N", help="list N rejected candidates")


def print_outcome(outcome, *, show_rejected: int = 10) -> None:
    """The table (rich), then the first rejected candidates with the reason."""
    from rich.console import Console
    from rich.table import Table

    colour = {"pass": "green", "warn": "yellow", "fail": "red"}
    table = Table(title=f"preflight: {'PASS' if outcome.ok else 'FAIL'}  (job folder {outcome.folder})")
    for col in ("check", "result", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in outcome.checks:
        table.add_row(c.name, f"[{colour[str(c.status)]}]{c.status}[/]", c.detail, c.fix)
    console = Console(width=200)
    console.print(table)
    for key, why in list(outcome.rejected.items())[:show_rejected]:
        console.print(f"rejected {key[:10]}: {why}", markup=False, highlight=False)
    if len(outcome.rejected) > show_rejected:
        console.print(f"... and {len(outcome.rejected) - show_rejected} more rejected candidates")


def run(args, overrides) -> int:
    from orchestrator import preflight

    cfg = compose(overrides, require_stage=True).cfg
    outcome = preflight.run(cfg)
    if args.format == "json":
        print(json.dumps(outcome.to_dict(), indent=1))
    else:
        print_outcome(outcome, show_rejected=args.show_rejected)
    return 0 if outcome.ok else 1
