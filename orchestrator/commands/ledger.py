"""`ledger export|sweeps|events`: read the ledger outside a sweep (exports for notebooks, audit log)."""

from __future__ import annotations

import json
import sys

from orchestrator.commands._shared import open_ledger, print_table, split_verb
from orchestrator.core.errors import UserError

NAME = "ledger"
HELP = "Ledger utilities: `ledger export --out FILE.csv|.parquet`, `ledger sweeps`, `ledger events --sweep NAME`."
VERBS = ("export", "sweeps", "events")


def add_arguments(parser) -> None:
    parser.add_argument("--out", help="export: output file (.csv or .parquet)")
    parser.add_argument(
        "--format",
        choices=["csv", "parquet", "table", "json"],
        default=None,
        help="export: csv|parquet (default from --out); sweeps/events: table|json",
    )
    parser.add_argument("--table", default=None, help="export one raw table instead of the joined view")
    parser.add_argument("--sweep", default=None)
    parser.add_argument("--stage", default=None)
    parser.add_argument("--where", action="append", default=[], metavar="KEY OP VALUE")


def run(args, overrides) -> int:
    verb, overrides = split_verb(overrides, VERBS, NAME)
    with open_ledger(overrides) as ledger:
        if verb == "export":
            from orchestrator.ledger.export import export

            if not args.out:
                raise UserError("ledger export needs --out FILE.csv or FILE.parquet")
            fmt = args.format if args.format in ("csv", "parquet") else None
            kw = {} if args.table else {"sweep": args.sweep, "stage": args.stage, "where": args.where}
            n = export(ledger, args.out, fmt, table=args.table, **kw)
            print(f"wrote {n} rows to {args.out} (ledger {ledger.url})")
            return 0
        if verb == "sweeps":
            rows = [
                {
                    "name": s.name,
                    "stage": s.stage,
                    "model": s.model,
                    "hardware": s.hardware,
                    "workload": s.workload,
                    "status": s.status,
                    "created_at": s.created_at.isoformat(),
                }
                for s in ledger.list_sweeps()
            ]
        else:
            if not args.sweep:
                raise UserError("ledger events needs --sweep NAME")
            rows = [
                {
                    "id": e.id,
                    "time": e.created_at.isoformat(timespec="seconds"),
                    "kind": e.kind,
                    "candidate_id": e.candidate_id,
                    "message": e.message,
                }
                for e in ledger.events(args.sweep)
            ]
        if args.format == "json":
            json.dump(rows, sys.stdout, indent=1, default=str)
            print()
        else:
            print_table(rows, title=f"ledger {ledger.url}: {verb}")
    return 0
