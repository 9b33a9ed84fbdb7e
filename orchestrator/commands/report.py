"""`python -m orchestrator report NAME [--out DIR]`: one self-contained HTML page for a sweep."""

from __future__ import annotations

NAME = "report"
HELP = "write an HTML report (ranked table, step-time CDFs, Pareto front, calibration, scaling) for a sweep"


def add_arguments(p) -> None:
    p.add_argument("name", help="sweep name")
    p.add_argument("--out", default=None, help="output folder (default: reports/NAME)")


def run(args, overrides) -> int:
    from db.ledger import Ledger
    from orchestrator.config import compose
    from orchestrator.report.html import report

    cfg = compose(overrides).cfg
    with Ledger.open(cfg.ledger.url, create=False) as ledger:
        path = report(ledger, args.name, args.out)
    print(f"report written: {path}")
    return 0
