"""`compare`: measured layouts side by side, from the ledger (candidate + latest attempt + result).

Filters are `--where KEY OP VALUE` (ep=64, tokens_per_gpu>=1000, recompute=moe_act, status=done);
keys come from orchestrator.ledger.queries.COLUMNS and values are bound as parameters, never pasted into SQL.

Every format carries `status`, `fidelity` and `measured` (added to --columns when left out), and full-window
measurements come first: a failed, probe-only, screen-only, partial or excluded row follows them, marked in
`measured`, whatever its figures (a fit probe's compute-only step reads as 3x the throughput of a layout that
ran at scale). --sort orders within each group; --all-sorted orders every row by --sort alone.
"""

from __future__ import annotations

import csv
import json
import sys
from typing import Any

from orchestrator.commands._shared import open_ledger, print_table, whole_number
from orchestrator.core.knobs import KNOBS
from orchestrator.core.metrics import STEP_P50

NAME = "compare"
HELP = "Compare measured layouts in the ledger: filter (--where ep=64), sort (--sort tokens_per_gpu), table/json/csv."
TABLE_LIMIT = 50


def add_arguments(parser) -> None:
    parser.add_argument("--sweep", default=None, help="only this sweep")
    parser.add_argument("--stage", default=None, help="only sweeps of this stage (1k, 8k, 16k, ...)")
    parser.add_argument("--round", type=whole_number(), default=None)
    parser.add_argument("--status", default=None, help="candidate status: planned|claimed|...|done|failed")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY OP VALUE",
        help="filter, repeatable: ep=64, 'tokens_per_gpu>=1000', recompute=moe_act",
    )
    parser.add_argument(
        "--sort",
        default=None,
        help="column; best first by default, -col/+col to force order; full-window measurements still come first",
    )
    parser.add_argument(
        "--all-sorted",
        action="store_true",
        help="order every row by --sort alone (failed, probe-only and screen-only rows among the measured ones)",
    )
    parser.add_argument("--limit", type=whole_number(), default=None, help=f"rows (table default {TABLE_LIMIT})")
    parser.add_argument("--columns", default=None, help="comma-separated columns (default: the headline set)")
    parser.add_argument("--format", choices=["table", "json", "csv"], default="table")


# Which columns a narrow terminal keeps (issue 49 item 6): the layout first (TP/PP/CP/EP), its step and status,
# its other knobs, its standing; the rest as --columns lists them.
LAYOUT_FIRST = ("tp", "pp", "cp", "ep")
PRIORITY = (
    *LAYOUT_FIRST,
    STEP_P50,
    "status",
    *(k.column for k in KNOBS if k.shown and k.part_of is None and k.column not in LAYOUT_FIRST),
    "measured",
    "fidelity",
)


def emit(rows: list[dict[str, Any]], fmt: str, columns: list[str], title: str) -> None:
    if fmt == "json":
        json.dump(rows, sys.stdout, indent=1, default=str)
        print()
    elif fmt == "csv":
        w = csv.DictWriter(sys.stdout, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    else:
        print_table(rows, title=title, columns=columns, priority=PRIORITY)


def run(args, overrides) -> int:
    from orchestrator.ledger import queries

    columns = [c.strip() for c in args.columns.split(",")] if args.columns else list(queries.DEFAULT_COLUMNS)
    # a row's standing is never left out: the same key under an alias counts as present
    named = {queries.ALIASES.get(c, c) for c in columns}
    columns += [c for c in queries.STANDING_COLUMNS if c not in named]
    limit = args.limit if args.limit is not None else (TABLE_LIMIT if args.format == "table" else None)
    with open_ledger(overrides) as ledger:
        rows = queries.compare(
            ledger,
            sweep=args.sweep,
            stage=args.stage,
            round=args.round,
            status=args.status,
            where=args.where,
            sort=args.sort,
            limit=limit,
            columns=columns,
            grouped=not args.all_sorted,
        )
        title = f"ledger {ledger.url}: {len(rows)} rows (measured values; simulated=yes marks twin runs)" + (
            f", sorted by {args.sort}" if args.sort else ""
        )
        if not args.all_sorted:
            title += "; rows not measured=full (failed, probe-only, screen-only, partial, excluded) follow"
    emit(rows, args.format, columns, title)
    return 0
