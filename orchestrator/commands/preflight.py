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


def run(args, overrides) -> int:
    from orchestrator import preflight

    cfg = compose(overrides, require_stage=True, command=NAME).cfg
    outcome = preflight.run(cfg)
    if args.format == "json":
        print(json.dumps(outcome.to_dict(), indent=1))
    else:
        preflight.print_table(outcome, show_rejected=args.show_rejected)
    return 0 if outcome.ok else 1
