"""Step `neighbour_hold` (issue 48 item 3): the sweep may not converge while the round it would drop proposes, at
scale, a layout one knob from the best measured that the searcher rates (`Round.rate`: its optimistic estimate)
more than policy.search.converge_gain under the best (`Round.held`). It adds no launch: the round it keeps is the
one the searcher and the other steps planned.

Why: `converged` counts rounds without a gain and is read after the next round is planned, so a round proposing the
best's own one-knob neighbour, rated faster than the best, was dropped unlaunched, and a fresh seed stopped short of
its optimum, that neighbour (docs/search-log.md "A planned neighbour holds convergence"). A stale count cannot speak
for a neighbour of the best: nothing measured says it is slower. Put last in policy.schedule.steps: it reads the
round the other steps (the budget's included) leave."""

from __future__ import annotations

from orchestrator.core.states import Fidelity
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round
from orchestrator.search.select import changed_knob


def run(r: Round) -> None:
    if r.best is None:
        return
    best = r.best.measured_step_s
    line = best * (1.0 - r.policy.search.converge_gain)
    for p in r.props:
        knob = changed_knob(p.layout, r.best.layout)
        if p.fidelity == Fidelity.PROBE or knob is None:  # a probe is held by its pass (Schedule.waiting)
            continue
        rated = r.rate(p.layout, p.predicted_step_s)
        if rated < line:
            under = 1.0 - rated / best
            r.held.append(f"{p.layout.short()} unmeasured: one {knob} from the best, rated {under:.1%} under it")


STEP = register(Step("neighbour_hold", run))
