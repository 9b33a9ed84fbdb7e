"""`resume NAME`: take the sweep's lease and continue it from the ledger.

Re-attaches to queued and running jobs by their stored ids, ingests the ones that finished while no
orchestrator watched, resubmits retryable failures, then carries on with the rounds.
"""

from __future__ import annotations

from orchestrator.commands.sweep import options, report, resume_command
from orchestrator.config import compose

NAME = "resume"
HELP = "Continue a sweep after a crash or kill: re-attach to its jobs by stored id, ingest, retry, go on."


def add_arguments(parser) -> None:
    parser.add_argument("name", help="sweep name (see `status`)")
    parser.add_argument(
        "--retry",
        action="append",
        default=[],
        metavar="CLASS",
        help="also resubmit this deterministic failure class, e.g. --retry oom",
    )
    parser.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    parser.add_argument("--max-wall", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--json", action="store_true")


def run(args, overrides) -> int:
    from orchestrator.sweep import resume_sweep
    from orchestrator.sweep.view import View

    composed = compose(overrides)
    view = View(live=False) if args.plain else View()
    outcome = resume_sweep(
        args.name,
        composed.cfg,
        overrides=overrides,
        options=options(args),
        view=view,
        resume=lambda name: resume_command(name, overrides),
    )
    return report(outcome, args, composed.cfg, overrides)
