"""Step `sibling_probes` (issue 48 items 1-3): a layout one knob (policy.schedule.sibling_probes.knobs) away from a
layout that ran at scale is estimated from that neighbour (orchestrator/search/nearest.py); where that estimate
and the calibrated absolute model dispute it (fitting HBM, or the step by more than policy.search.converge_gain)
and its optimistic estimate (less policy.search.explore x the knob's spread over measured pairs) beats the best
measured by more than converge_gain, the layout gets a rank probe
(policy.schedule.sibling_probes.per_round a round, the best estimated first), is measured at scale once the
probe ran without an OOM, and the sweep may not converge while it is unmeasured (`Round.held`).

Why: the absolute memory model charged 5-10x what dropping a light recompute module costs, so the optimum one
module from a measured layout was called over capacity, never proposed nor probed, and the sweep stopped
"converged" 2.2-2.6% short (issue 48). A probe costs one GPU per probed rank for minutes."""

from __future__ import annotations

from orchestrator.core.states import Fidelity
from orchestrator.plan import probe as plan_probe
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round, rank_probe, screened
from orchestrator.search import nearest
from orchestrator.search.types import Proposal


def run(r: Round) -> None:
    cfg, inp, env = r.policy.schedule.sibling_probes, r.inp, r.env
    if r.best is None or r.fit is None:
        return
    best, gain = r.best.measured_step_s, r.policy.search.converge_gain
    rows = inp.observations
    latest = {o.key: o for o in rows}
    found = nearest.estimates(env, r.fit, rows, knobs=cfg.knobs, step_margin=gain, explore=r.policy.search.explore)
    due = [
        e
        for e in found
        if e.disputed
        and e.optimistic_s < best * (1.0 - gain)
        and not nearest.settled(e.layout, e.key, rows)
        and plan_probe.unprobeable(e.layout) is None
    ]
    r.held = [f"{e.layout.short()} unmeasured: {e.why()}" for e in due]
    taken = {p.key for p in [*r.props, *r.confirms]}
    probes: list[Proposal] = []
    for e in due:
        if e.key in taken:
            continue
        seen = latest.get(e.key)
        why = f"sibling: {e.why()}; optimistic {1.0 - e.optimistic_s / best:.1%} under the best"
        if seen is not None and seen.probe_ran:  # probed, no OOM: the launch at scale settles it
            r.confirms.append(_at_scale(r, e, why, seen.raw_step_s))
        elif e.key not in inp.known_keys and len(probes) < cfg.per_round:
            planned = env.evaluate_unchecked(e.layout, r.fit.factors, r.fit.memory_scale)
            if planned is not None:
                probes.append(rank_probe(env, planned, r.fit, f"sibling-probe: {e.why()}", best))
    r.props = probes + r.props


def _at_scale(r: Round, e: nearest.NearestEstimate, why: str, raw_step_s: float) -> Proposal:
    """The probed layout measured at scale (screened when the round screens), charged at its estimate."""
    p = Proposal(
        key=e.key,
        layout=e.layout,
        predicted={},
        reason=why,
        fidelity=Fidelity.FULL,
        predicted_gain=1.0 - e.step_s / r.best_step if r.best_step else None,
        est_gpu_hours=r.env.gpu_hours(e.step_s),
        charge_step_s=e.step_s or raw_step_s,
    )
    return screened(r.env, p, r.inp.step_cv, e.step_s) if r.screening else p


STEP = register(Step("sibling_probes", run))
