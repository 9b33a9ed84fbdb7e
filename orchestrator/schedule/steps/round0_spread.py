"""Step `round0_spread`: a probe-led round 0 (policy.schedule.probe_led) with nothing measured also rank-probes
policy.schedule.round0_spread.probes layouts the uncalibrated memory model prunes inside its default band,
spread over EP, PP, CP and recompute (steps/fit_probes.probes with no fit: ROUND0_PROBE_KNOBS)."""

from __future__ import annotations

from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round
from orchestrator.schedule.steps.fit_probes import probes


def run(r: Round) -> None:
    n, inp = r.policy.schedule.round0_spread.probes, r.inp
    if r.policy.schedule.probe_led and inp.round == 0 and not inp.observations and n > 0:
        taken = {p.key for p in r.props}
        r.props = probes(r.policy, r.env, inp, None, None, taken, limit=n) + r.props


STEP = register(Step("round0_spread", run))
