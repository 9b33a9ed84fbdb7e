"""Step `propose`: the searcher's proposals, as many as the round has slots (policy.schedule.round0_size,
round_size; screen_round_size in a round of short launches) less the confirmations already in it."""

from __future__ import annotations

from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round, round_size, warm_window


def run(r: Round) -> None:
    short = r.screening or warm_window(r.env, r.inp)  # a round of short launches proposes more of them
    r.size = round_size(r.policy, r.inp, screening=short) - len(r.confirms)
    r.props = r.searcher.propose(r.env, r.inp, size=r.size, fit=r.fit, source_stage=r.source_stage)


STEP = register(Step("propose", run))
