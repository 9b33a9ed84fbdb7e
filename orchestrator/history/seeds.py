"""The warm start's seed, read from the ledger and the job folders: the checkpoint a measured seed launch saved
(its tracker on disk), or why the sweep has none and runs cold.

Read-only (orchestrator/history/ writes nothing): recomputed from the ledger on each call, never cached across
rounds, so a resumed driver sees exactly what the killed one had written.
"""

from __future__ import annotations

from orchestrator.core.paths import CheckpointPaths, JobPaths
from orchestrator.core.states import CandidateStatus, Fidelity
from orchestrator.ledger.ledger import Ledger, SweepRow


def _seed_runs(ledger: Ledger, sweep: SweepRow) -> list[str]:
    """The checkpoint folders of the sweep's launches that were to save its seed and measured (candidate done,
    its full-window attempt without a failure: Megatron saves after the last iteration), first first."""
    out = []
    for c in ledger.candidates(sweep.name):
        if not c.decision.seed_save or c.status not in (CandidateStatus.DONE, CandidateStatus.EXCLUDED):
            continue
        out += [
            str(JobPaths(a.job_dir).seed_checkpoint)
            for a in ledger.attempts(c.id)
            if a.fidelity == Fidelity.FULL and a.failure_class is None
        ]
    return out


def _saved(folder: str) -> bool:
    """Megatron's tracker file (latest_checkpointed_iteration.txt) is on disk: the checkpoint was written."""
    return CheckpointPaths(folder).tracker.is_file()


def seed(ledger: Ledger, sweep: SweepRow) -> str | None:
    """The sweep's seed (stage.warm_start): the first seed run whose checkpoint is on disk; None before any."""
    return next((f for f in _seed_runs(ledger, sweep) if _saved(f)), None)


def seedless(ledger: Ledger, sweep: SweepRow) -> str | None:
    """Why the sweep runs cold from now on, when a launch measured that was to save the seed and no seed is on
    disk: the workload does not honour --save (or the seed was removed). None otherwise."""
    runs = _seed_runs(ledger, sweep)
    if not runs or any(_saved(f) for f in runs):
        return None
    return (
        f"warm start off: a launch that was to save the seed measured but left no checkpoint at {runs[0]} "
        "(the workload does not honour --save, or the seed was removed); later launches wait out the stage's "
        "own warm-up"
    )
