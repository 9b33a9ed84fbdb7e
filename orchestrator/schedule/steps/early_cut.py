"""Step `early_cut`: each launch at scale gets its cut line (stage.screen.cut*, fidelity.CutLine) against the best
full-window p50 (before any, the seed's launch against its own expected step); it stays charged its whole window (a
cut is a saving measured when it happens, never assumed)."""

from orchestrator.schedule import fidelity
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round


def run(r: Round) -> None:
    for p in [*r.confirms, *r.props]:
        p.cut = fidelity.cut_line(r.env.stage, r.best_step, p.decision(), p.charge_step_s or p.predicted_step_s)


STEP = register(Step("early_cut", run))
