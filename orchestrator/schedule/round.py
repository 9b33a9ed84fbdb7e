"""One round as the schedule's steps build it (`Round`), and the rungs more than one step uses: the round's
size, the screen's window, a layout as a rank probe, and the probed layouts due a launch at scale (`passed`).

Why apart from the steps (schedule/steps/): these are read by several steps and by `Schedule.waiting`, so each
has one owner here; what only one step does lives in that step's module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.schema import PolicyConfig, StageConfig
from orchestrator.core.states import Fidelity
from orchestrator.plan import ranks
from orchestrator.plan.planner import Planned
from orchestrator.schedule import fidelity
from orchestrator.search import compose
from orchestrator.search.calibrate import Fit
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import best_measured
from orchestrator.search.types import Observation, Proposal, Rate, RoundInput, unrated


@dataclass
class Round:
    """The round being planned: what every step reads (the policy, the searcher, its fit and rating, the best
    measured, whether the round screens) and what the steps build in turn (confirmations, proposals)."""

    policy: PolicyConfig
    searcher: Any  # orchestrator/search/policies.Policy (the schedule stands on the searchers, never imports one)
    env: PlanEnv
    inp: RoundInput
    source_stage: StageConfig | None
    fit: Fit | None
    rate: Rate
    screening: bool  # new layouts are screened (`screening`)
    best: Observation | None  # the best measured so far (select.best_measured)
    learned: int | None  # the warm-up the sweep's warm launches showed (fidelity.learned_warmup)
    confirms: list[Proposal] = field(default_factory=list)
    props: list[Proposal] = field(default_factory=list)
    size: int = 0  # the round's slots for new proposals (step `propose`)
    held: list[str] = field(default_factory=list)  # why the sweep may not converge yet (step `sibling_probes`)

    @property
    def best_step(self) -> float | None:
        return self.best.measured_step_s if self.best else None


def warm_window(env: PlanEnv, inp: RoundInput) -> bool:
    """Every launch at scale of this round loads the sweep's seed (stage.warm_start)."""
    return inp.seed is not None and not inp.seedless and fidelity.warm_start_on(env.stage)


def screening(env: PlanEnv, inp: RoundInput) -> bool:
    """New layouts are screened after round 0, once noise is measured and a screen is shorter than a full run
    (a warm one once the sweep has a seed)."""
    return inp.round > 0 and fidelity.use_screen(env.stage, inp.step_cv, warm=warm_window(env, inp))


def round_size(policy: PolicyConfig, inp: RoundInput, *, screening: bool = False) -> int:
    cfg = policy.schedule
    size = cfg.round0_size if inp.round == 0 else cfg.round_size
    if screening and cfg.screen_round_size:
        size = cfg.screen_round_size
    return max(0, min(size, inp.slots))


def screened(env: PlanEnv, p: Proposal, cv: float | None, step_s: float | None = None) -> Proposal:
    """The proposal at the screen's window (sized from the stage's measured noise), charged for it (at
    `step_s`, else its predicted step)."""
    st = env.stage
    w, n = fidelity.window(st, Fidelity.SCREEN, fidelity.screen_iters(st, cv))
    p.fidelity, p.measure_iters = Fidelity.SCREEN, n
    p.charge_step_s = step_s or p.charge_step_s
    p.est_gpu_hours = env.gpu_hours(p.charge_step_s or p.predicted_step_s, w + n)
    return p


def as_probe(env: PlanEnv, p: Proposal) -> list[int]:
    """Make `p` a one-GPU rank probe of the ranks that bound it (ranks.probe_ranks: first PP stage, last, the
    planner's heaviest), for start-up + the probe window, charged one GPU per rank; the ranks."""
    bound = ranks.probe_ranks(p.layout, env.stage.gpus, p.predicted.get("heaviest_stage"))
    _, n = fidelity.window(env.stage, Fidelity.PROBE)
    p.fidelity, p.measure_iters, p.probe_ranks = Fidelity.PROBE, n, tuple(bound)
    p.est_gpu_hours = env.probe_gpu_hours(len(bound), p.predicted_step_s)
    return bound


def rank_probe(env: PlanEnv, c: Planned, fit: Fit | None, why: str, best_step: float | None = None) -> Proposal:
    """A planned layout as a rank probe (`as_probe`), proposed for `why`."""
    factors, mem = (fit.factors, fit.memory_scale) if fit is not None else (None, 1.0)
    p = env.proposal(
        c,
        reason=why,
        factors=factors,
        memory_factor=mem,
        predicted_gain=1.0 - c.prediction.step_time_s / best_step if best_step else None,
    )
    bound = as_probe(env, p)
    p.reason += f" (rank probe of ranks {', '.join(map(str, bound))} on one GPU each)"
    return p


def passed(
    policy: PolicyConfig, inp: RoundInput, fit: Fit | None, rate: Rate = unrated, *, holding: bool = False
) -> list[tuple[Observation, str]]:
    """Probed layouts due a measurement at scale (found to fit; probe-led, policy.schedule.probe_led, also those
    too close to HBM to call with the probe margin, Observation.probe_ran, which only a launch at scale settles,
    an OOM there costing start-up and an iteration), best first, with why: every one while nothing is
    measured or calibrated (probe-led round 0: the best round0_size by composed step); else those whose
    composed step (Fit.predict_row: the probe's compute + the calibrated communication), as the searcher
    rates it (`rate`, Policy.estimate: calibrated_neighbours' optimistic bound from what the knob values
    measured elsewhere), is within policy.schedule.probe_pass of the best measured step, at most a round's worth.
    Why the rating: the composed step alone ran 16-22% over the truth for `mixed` optima (s175 1k: 77.5 s
    composed, 66.9 s true, cut 74.7 s), which were then never launched (docs/search-log.md, "A probed
    layout passes as the searcher rates it"). A probe without its compute-only step (a fit probe of old) passes.
    `holding`: those that hold the sweep open (Schedule.waiting), each composed step first lifted by how far the
    layouts probed before it ran over theirs at scale (compose.scale_bias); a round that runs anyway measures every
    one that passes as it is (the confirm step)."""
    cfg = policy.schedule
    rows = [r for r in inp.observations if (r.probe_ran if cfg.probe_led else r.probed_fit)]
    best = best_measured(inp.observations)
    if best is None and cfg.probe_led and any(r.probe_scale for r in rows):
        # round 0 probed before any launch at scale: the best composed first (the first saves the seed)
        def composed(r: Observation) -> float:
            return fit.predict_row(r) if fit is not None else compose.step({}, r.raw_components, r.probe_scale)

        ranked = sorted(rows, key=composed)[: max(1, min(cfg.round0_size, inp.slots))]
        return [(r, f"; composed step {composed(r):.4g}s, nothing measured at scale yet") for r in ranked]
    if fit is None or best is None:
        return [(r, "") for r in rows]
    cut = best.measured_step_s * (1.0 + cfg.probe_pass)
    bias = compose.scale_bias(inp.observations, fit.predict) if holding else 1.0
    scored = sorted((rate(r.layout, s := fit.predict_row(r) * bias), s, i, r) for i, r in enumerate(rows))
    out = [
        (
            r,
            f"; composed step {s:.4g}s, rated {v:.4g}s, vs best {best.measured_step_s:.4g}s" if r.probe_scale else "",
        )
        for v, s, _, r in scored
        if v <= cut or r.probe_scale is None
    ]
    return out[: max(1, round_size(policy, inp))]
