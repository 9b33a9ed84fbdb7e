"""What the sweep driver launches: one attempt of one candidate, its JobSpec saying role, fidelity and window.

Why a type of its own: the driver has ONE launch path (orchestrator/sweep/loop.py `Driver._launch`: intent
with a token before sbatch, job id recorded as its array exists, adopted on resume, polled, collected,
retried) and two sources of attempts, the search's measurements and the finalists' jobs
(orchestrator/sweep/finalists.py); both hand it these.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core.spec import JobSpec
from orchestrator.ledger.rows import CandidateRow
from orchestrator.plan.planner import Planned


@dataclass(frozen=True)
class Launch:
    candidate_id: int  # the candidate the attempt belongs to (a parity reference: the finalist it checks)
    spec: JobSpec  # job_dir, role, fidelity and window of the attempt
    exclude: str = ""  # nodes to keep off (a retry after NODE_FAIL)


def planned_from_row(c: CandidateRow) -> Planned:
    """Rebuild the planner's Planned from a ledger row (its stored prediction), for build_spec.

    It carries the ledger's key: job.json, the job folder and the twin's seed must all name the row."""
    pred = c.prediction
    if pred is None:
        raise ValueError(f"candidate {c.key[:10]} stores no prediction of the models to launch it with")
    return Planned(c.layout, pred, key=c.key)
