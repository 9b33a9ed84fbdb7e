"""The warm start's order inside a round (stage.warm_start): which planned launches must wait for the seed.

The warm_start step (orchestrator/schedule/steps/warm_start.py) plans a round without a seed as one launch that
saves it (`seed_save`) and the others waiting for it (`after_seed`). Before each claim the driver (and the bench)
asks `waiting`: once the seed is there (history.seed), every waiting launch is re-decided to load it (`warm_from`);
while the launch that saves it is still queued or running, they wait; if it ended without a seed (an OOM, a crash,
an early cut), the first waiting launch saves one instead, at the stage's own warm-up and held to the fastest step
any launch at scale has run, and the others wait for that; if it measured but left no checkpoint (a workload that
does not honour --save), none waits again and the sweep runs cold (`history.seedless`, the re-decision's event says
why). So a round never waits on nothing, and a resumed driver resolves the same wait the same way: the decision it
launches under is in the ledger before the launch.
"""

from __future__ import annotations

from orchestrator import history
from orchestrator.core.decision import Decision
from orchestrator.core.schema import StageConfig
from orchestrator.core.states import CandidateStatus
from orchestrator.ledger.ledger import Ledger, SweepRow
from orchestrator.schedule import fidelity


def _with_cut(decision: Decision, stage: StageConfig | None, best_s: float | None) -> Decision:
    """A released launch planned before any best (round 0) gets its early cut now, against the best the seed's
    launch measured (the early_cut step gives every other launch its line as it is planned)."""
    if stage is None or decision.cut is not None:
        return decision
    line = fidelity.cut_line(stage, best_s, decision)
    return decision.but(cut=line) if line else decision


def waiting(ledger: Ledger, sweep: SweepRow, stage: StageConfig | None = None) -> set[int]:
    """Ids of planned candidates that must not launch yet; the ones that may go are re-decided first (with
    their early cut, given the `stage`)."""
    cands = ledger.candidates(sweep.name)
    held = [c for c in cands if c.status == CandidateStatus.PLANNED and c.decision.after_seed]
    if not held:
        return set()
    seed = history.seed(ledger, sweep)
    if seed is not None:
        best_s = history.best_step_s(ledger, sweep.name)
        for c in held:
            # released from its wait (`after_seed`), the launch names what it does instead
            d = _with_cut(c.decision.but(after_seed=False, warm_from=seed), stage, best_s)
            ledger.redecide(c.id, d, f"warm start: loads the seed {seed}")
        return set()
    if any(c.decision.seed_save and c.status in CandidateStatus.LIVE for c in cands):
        return {c.id for c in held}
    off = history.seedless(ledger, sweep)
    if off is not None:  # a seeder measured and saved nothing: no launch waits for a seed again
        for c in held:
            ledger.redecide(c.id, c.decision.but(after_seed=False), off)
        return set()
    first, rest = held[0], held[1:]
    why = "warm start: no seed was saved, this launch saves it"
    saver = first.decision.but(after_seed=False, seed_save=True)
    if stage is not None:  # a saver slower than a layout already run at scale is cut (as the one before it may be)
        line = fidelity.cut_line(stage, history.fastest_at_scale_s(ledger, sweep.name), saver)
        saver = saver.but(cut=line) if line else saver
    ledger.redecide(first.id, saver, why)
    return {c.id for c in rest}
