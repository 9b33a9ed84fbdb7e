"""`cancel NAME`: scancel every live job of a sweep and record it in the ledger.

A finished sweep (done, or already cancelled) with no live job keeps its status: relabelling a finished
search `cancelled` would hide that it ended on its own.
"""

from __future__ import annotations

from orchestrator.config import compose
from orchestrator.core.failures import Failure
from orchestrator.core.states import AttemptState, CandidateStatus, EventKind, SweepStatus

NAME = "cancel"
HELP = "Cancel every live job of a sweep (scancel on Slurm) and record the cancellation in the ledger."


def add_arguments(parser) -> None:
    parser.add_argument("name", help="sweep name")


def run(args, overrides) -> int:
    from orchestrator.sweep import bound_launcher, open_stored, stored_config, stored_sweep
    from orchestrator.sweep.view import View

    current = compose(overrides).cfg
    with open_stored(current, args.name) as ledger:
        cfg = stored_config(ledger, args.name, current, overrides)  # a cluster.* override keeps the stored kind
        # The launcher the jobs run on (waiting for a Slurm that does not answer; nothing is changed if it
        # never does), then the sweep's status first: a driver deciding a round right now submits nothing more,
        # and cancels whatever it launched meanwhile (sweep/loop.py _cancel_own_jobs).
        status = stored_sweep(ledger, args.name).status
        if not ledger.live_attempts(args.name) and status in (SweepStatus.DONE, SweepStatus.CANCELLED):
            View(live=False).event(f"sweep {args.name} is {status}: nothing to cancel (its status stays {status})")
            return 0
        launcher = bound_launcher(ledger, cfg, args.name, View(live=False)) if ledger.live_attempts(args.name) else None
        ledger.set_sweep_status(args.name, SweepStatus.CANCELLED)
        live = ledger.live_attempts(args.name)
        ids = [a.job_id for a in live if a.job_id]
        if ids:
            launcher = launcher or bound_launcher(ledger, cfg, args.name, View(live=False))
            if not _left_to_its_driver(ledger, args.name, launcher.kind):
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
            EventKind.CANCELLED,
            f"cancelled {len(ids)} live job(s): {', '.join(ids) or 'none'}",
            data={"job_ids": ids},
        )
    listed = f": {', '.join(ids)}" if ids else ""
    View(live=False).event(f"sweep {args.name}: cancelled {len(ids)} live job(s){listed}")
    return 0


def _left_to_its_driver(ledger, name: str, kind: str) -> bool:
    """Local jobs of a sweep whose driver lives are that driver's to stop: it sees the sweep cancelled at its next
    poll and cancels them as its own (CANCELLED); signalled from here, they would end under it as crashed jobs. A
    killed driver's local jobs are stopped here, each by its identity (`pid:start`)."""
    if kind != "local":
        return False
    held = ledger.leases.lease(name)
    return held is not None and held.alive is True
