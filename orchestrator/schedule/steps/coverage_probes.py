"""Step `coverage_probes`: each round, policy.schedule.coverage_probes.per_round rank probes of the best rated
layout of a knob value that no layout which ran on the stage carries."""

from __future__ import annotations

from orchestrator.plan import probe as plan_probe
from orchestrator.plan.planner import Planned
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round, rank_probe
from orchestrator.search.calibrate import Fit
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import KNOBS, knob_value, oom_dominated, ran, value_label
from orchestrator.search.types import Proposal, Rate, RoundInput, unrated

# What a rank probe's compute-only step can tell apart (`coverage`): every knob group but the dispatcher's
# (a probe runs alltoall whatever the layout's dispatcher, argv.probe_argv).
COVERED_KNOBS = tuple(group for group in KNOBS if group != "dispatcher")


def coverage(
    env: PlanEnv,
    inp: RoundInput,
    fit: Fit,
    best_step: float,
    taken: set[str],
    rate: Rate = unrated,
    *,
    limit: int,
) -> list[Proposal]:
    """Coverage probes: for each knob value (PP x VPP, CP, EP, micro-batch, recompute) that no layout which ran
    on this stage's GPUs carries, the searcher's best rated layout with it gets a rank probe, the best rated
    values first, at most `limit` a round. Why: a probe times the layout's own compute, which is where the
    calibrated model is wrong region by region, and a region no row of this stage measured has only the model
    to speak for it; its probe costs one GPU per probed rank for minutes. A probe that fits is measured at scale
    only when its composed step passes (schedule/round.passed), as any probe's. The dispatcher is left out: a
    rank probe runs alltoall whatever the layout's dispatcher (argv.probe_argv)."""
    seen = list(inp.observations) + list(inp.source)
    factors, mem = fit.factors, fit.memory_scale
    pool = [
        c
        for c in env.plan(factors, mem)
        if c.key not in inp.known_keys
        and c.key not in taken
        and not oom_dominated(c.layout, seen)
        and plan_probe.unprobeable(c.layout) is None
    ]
    rated = sorted(((rate(c.layout, c.prediction.step_time_s), i, c) for i, c in enumerate(pool)))
    best_of: dict[tuple, tuple[float, int, Planned]] = {}  # (knob, value) -> its best rated layout
    for knob in COVERED_KNOBS:
        covered = {knob_value(r.layout, knob) for r in inp.observations if ran(r)}
        for r, i, c in rated:
            best_of.setdefault((knob, knob_value(c.layout, knob)), (r, i, c))
        for value in covered:
            best_of.pop((knob, value), None)
    out: list[Proposal] = []
    for (knob, value), (_, _, c) in sorted(best_of.items(), key=lambda kv: kv[1][:2]):
        if len(out) < limit and all(p.key != c.key for p in out):
            why = f"coverage-probe: no layout with {value_label(knob, value)} ran here"
            out.append(rank_probe(env, c, fit, why, best_step))
    return out


def run(r: Round) -> None:
    n = r.policy.schedule.coverage_probes.per_round
    if r.best is not None and r.fit is not None and n > 0:
        taken = {p.key for p in r.props}
        r.props = coverage(r.env, r.inp, r.fit, r.best.measured_step_s, taken, r.rate, limit=n) + r.props


STEP = register(Step("coverage_probes", run))
