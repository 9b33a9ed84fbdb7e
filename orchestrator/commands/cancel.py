"""`cancel NAME`: scancel every live job of a sweep and record it in the ledger.

A finished sweep (done, or already cancelled) with no live job keeps its status: relabelling a finished
search `cancelled` would hide that it ended on its own.
"""

from __future__ import annotations

from jobs.failures import Failure
from orchestrator.config import compose
from orchestrator.states import AttemptState, CandidateStatus, SweepStatus
from orchestrator.sweep import open_ledger, stored_config, stored_sweep
from orchestrator.sweep.view import View

NAME = "cancel"
HELP = "Cancel every live job of a sweep (scancel on Slurm) and record the cancellation in the ledger."


def add_arguments(parser) -> None:
    parser.add_argument("name", help="sweep name")


def run(args, overrides) -> int:
    from orchestrator.launch import make_launcher

    current = compose(overrides).cfg
    with open_ledger(current) as ledger:
        cfg = stored_config(ledger, args.name, current)
        if any(o.lstrip("+").startswith("cluster") for o in overrides):
            cfg.cluster = current.cluster
        live = ledger.live_attempts(args.name)
        status = stored_sweep(ledger, args.name).status
        if not live and status in (SweepStatus.DONE, SweepStatus.CANCELLED):
            View(live=False).event(f"sweep {args.name} is {status}: nothing to cancel (its status stays {status})")
            return 0
        ids = [a.job_id for a in live if a.job_id]
        if ids:
            launcher, _reason = make_launcher(cfg.cluster)
            launcher.cancel(ids)
        for a in live:
            ledger.update_attempt(
                a.id,
                state=AttemptState.CANCELLED,
                failure_class=Failure.CANCELLED,
                failure_detail="cancelled by `orchestrator cancel`",
            )
        for c in ledger.candidates(args.name, status=CandidateStatus.LIVE):
            ledger.set_candidate_status(c.id, CandidateStatus.CANCELLED, "cancelled by `orchestrator cancel`")
        ledger.log_event(
            args.name,
            "cancelled",
            f"cancelled {len(ids)} live job(s): {', '.join(ids) or 'none'}",
            data={"job_ids": ids},
        )
        ledger.set_sweep_status(args.name, SweepStatus.CANCELLED)
    listed = f": {', '.join(ids)}" if ids else ""
    View(live=False).event(f"sweep {args.name}: cancelled {len(ids)} live job(s){listed}")
    return 0
