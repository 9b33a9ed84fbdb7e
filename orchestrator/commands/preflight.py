"""`preflight +stage=1k [workload=megatron cluster=slurm]`: can this cluster run the stage with real Megatron?

Runs the checks of orchestrator/preflight.py (Slurm's limits from here, printed first, then a 1-node job through
the same launcher) and prints one row per check with its fix. Exit 0 when nothing failed, else 1; 2 with one
`error:` line when the stage's jobs can never run on the partition (its size and the fix).
"""

from __future__ import annotations

import json

from orchestrator.config import compose, runnable_fix
from orchestrator.core.errors import UserError

NAME = "preflight"
HELP = "Check the cluster, container and Megatron checkout on one node before a sweep spends budget."


def add_arguments(parser) -> None:
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--show-rejected", type=int, default=10, metavar="N", help="list N rejected candidates")


def run(args, overrides) -> int:
    from orchestrator import preflight

    cfg = compose(overrides, require_stage=True, command=NAME).cfg
    table = args.format != "json"
    outcome = preflight.run(cfg, on_static=preflight.print_static if table else None)
    if table:
        preflight.print_table(outcome, show_rejected=args.show_rejected, skip_static=True)
    else:
        print(json.dumps(outcome.to_dict(), indent=1))
    if outcome.refusal:  # the stage can never run on this partition: the one line to act on
        fix = runnable_fix(NAME, overrides)
        raise UserError(f"{outcome.refusal}; this runs there: {fix}" if fix else outcome.refusal)
    return 0 if outcome.ok else 1
