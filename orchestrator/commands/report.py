"""`python -m orchestrator report NAME [--out DIR]`: one self-contained HTML page for a sweep."""

from __future__ import annotations

NAME = "report"
HELP = "write an HTML report (ranked table, step-time CDFs, Pareto front, calibration, scaling) for a sweep"


def add_arguments(p) -> None:
    p.add_argument("name", help="sweep name")
    p.add_argument("--out", default=None, help="output folder inside reports/ (default: reports/NAME)")


def run(args, overrides) -> int:
    from orchestrator.config import compose
    from orchestrator.ledger.ledger import Ledger
    from orchestrator.report.html import out_folder, report

    cfg = compose(overrides).cfg
    folder = out_folder(args.name, args.out)
    with Ledger.from_config(cfg.ledger) as ledger:
        path = report(ledger, args.name, folder)
    print(f"report written: {path}")
    return 0
