"""Step `confirm`: the measurements the sweep has already earned, first in the round: screened contenders back
at the full window (successive halving's next rung) and probed layouts that passed (schedule/round.passed), now
measured at scale. Its settings: stage.screen.confirm_per_round; the pass, policy.schedule.probe_pass."""

from __future__ import annotations

from orchestrator.core.schema import PolicyConfig
from orchestrator.core.states import Fidelity
from orchestrator.schedule import fidelity
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round, passed, screened
from orchestrator.search.calibrate import Fit
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import best_measured
from orchestrator.search.types import Proposal, Rate, RoundInput, unrated


def confirms(
    policy: PolicyConfig,
    env: PlanEnv,
    inp: RoundInput,
    fit: Fit | None = None,
    *,
    screening: bool = False,
    rate: Rate = unrated,
) -> list[Proposal]:
    """Screened contenders (fidelity.contenders) back at the full window: successive halving's next rung;
    and layouts a probe found to fit (`passed`), now measured at scale (screened when the round screens)."""
    limit = min(env.stage.screen.confirm_per_round, inp.slots if inp.slots > 0 else 0)
    out = []
    for r, why in passed(policy, inp, fit, rate):
        p = Proposal(
            key=r.key,
            layout=r.layout,
            predicted={},
            reason=(
                f"{'probed-fit' if r.probed_fit else 'probed-close'}: max reserved "
                f"{r.measured_peak_gb - r.probe_margin_gb:.1f} GB"
                + (f" + {r.probe_margin_gb:.1f} GB probe margin" if r.probe_margin_gb else "")
                + f" of {r.hbm_gb:.0f} GB"
                + ("" if r.probed_fit else " (too close to call: the launch at scale decides)")
                + why
            ),
            fidelity=Fidelity.FULL,
            est_gpu_hours=env.gpu_hours(r.raw_step_s),
            charge_step_s=r.raw_step_s,
        )
        out.append(screened(env, p, inp.step_cv, r.raw_step_s) if screening else p)
    for r in fidelity.contenders(inp.observations, inp.step_cv, limit):
        hw = fidelity.half_width(inp.step_cv or 0.0, r.measure_iters or 1)
        best = best_measured(inp.observations)
        p = Proposal(
            key=r.key,
            layout=r.layout,
            predicted={},
            reason=f"confirm: screened p50 {r.measured_step_s:.4g}s +/- {hw:.1%}",
            fidelity=Fidelity.FULL,
            predicted_gain=(1.0 - r.measured_step_s / best.measured_step_s) if best else None,
            uncertainty=hw,
            est_gpu_hours=env.gpu_hours(r.measured_step_s),
            charge_step_s=r.measured_step_s,
        )
        out.append(p)
    return out


def run(r: Round) -> None:
    r.confirms = confirms(r.policy, r.env, r.inp, r.fit, screening=r.screening, rate=r.rate)


STEP = register(Step("confirm", run))
