"""`best`: the fastest layout by MEASURED step time (tie-break p99, then lower peak reserved memory).

Never chosen on predictions; only non-partial successful results count, and a candidate that
failed a parity check is excluded. JSON carries the evidence: every metric, job id, log paths.
"""

from __future__ import annotations

import json
import sys

from orchestrator.commands._shared import open_ledger, print_table
from orchestrator.errors import UserError

NAME = "best"
HELP = "The best measured layout of a sweep (step p50, then p99, then memory headroom) with its evidence."


def add_arguments(parser) -> None:
    parser.add_argument("--sweep", default=None, help="sweep name (default: all sweeps)")
    parser.add_argument("--stage", default=None)
    parser.add_argument("--format", choices=["json", "table"], default="json")
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")


def run(args, overrides) -> int:
    from db import queries

    with open_ledger(overrides) as ledger:
        hit = queries.best(ledger, sweep=args.sweep, stage=args.stage)
        url = ledger.url
    if hit is None:
        scope = f"sweep '{args.sweep}'" if args.sweep else "the ledger"
        raise UserError(f"no successful, non-partial measured result in {scope} ({url}); run or resume the sweep")
    if args.format == "json":
        json.dump(hit, sys.stdout, indent=1, default=str)
        print()
        return 0
    flat = {k: v for k, v in hit.items() if not isinstance(v, dict)}
    flat.update({f"attempt.{k}": v for k, v in hit["attempt"].items()})
    flat.update({k: v for k, v in hit["metrics"].items() if not isinstance(v, dict)})
    print_table(
        [{"field": k, "value": json.dumps(v, default=str) if isinstance(v, list) else v} for k, v in flat.items()],
        title=f"best of {args.sweep or 'all sweeps'} ({hit['chosen_on']})",
    )
    return 0
