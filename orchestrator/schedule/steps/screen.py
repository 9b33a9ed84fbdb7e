"""Step `screen`: once the stage's step-time noise is measured (after round 0), the round's new layouts run at
the screen's short window sized from it (schedule/round.screened; stage.screen.*), not the full one."""

from __future__ import annotations

from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round, screened


def run(r: Round) -> None:
    if r.screening:
        r.props = [screened(r.env, p, r.inp.step_cv) for p in r.props]


STEP = register(Step("screen", run))
