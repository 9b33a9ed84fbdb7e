"""Step `fit_probes`: rank probes of the most promising layouts the calibrated memory model prunes while HBM
lies inside its error band, policy.schedule.fit_probes.per_round a round once something is measured and
calibrated. `probes` also serves round 0's spread (steps/round0_spread.py)."""

from __future__ import annotations

from orchestrator.core.schema import PolicyConfig
from orchestrator.core.states import Fidelity
from orchestrator.plan import probe as plan_probe
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round, rank_probe
from orchestrator.search.calibrate import Fit
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import diverse_top, fit_dominated, oom_dominated, same_memory
from orchestrator.search.types import Proposal, Rate, RoundInput, unrated

# Round 0's probes spread over these knob groups (select.diverse_top; "pp" carries VPP): the memory model's error
# is per term, so which pruned region fits is what round 0 cannot know.
ROUND0_PROBE_KNOBS = ("ep", "pp", "cp", "recompute")


def probes(
    policy: PolicyConfig,
    env: PlanEnv,
    inp: RoundInput,
    fit: Fit | None,
    best_step: float | None,
    taken: set[str],
    rate: Rate = unrated,
    *,
    limit: int,
) -> list[Proposal]:
    """Rank probes: the most promising layouts the calibrated memory model prunes while HBM lies inside its
    error band (env.memory_band), never one already known to fit or dominated by an OOM. Promising as the
    searcher rates them (`rate`, Policy.estimate: calibrated_neighbours' optimistic bound), not by the
    calibrated step alone, which is where the model is most wrong layout by layout. Each runs the
    ranks that bound the layout (ranks.probe_ranks: first PP stage, last, the planner's heaviest) alone
    on one GPU each with Megatron's --fake-process-group for start-up plus a few iterations, reading
    max reserved memory. One found to fit (its peak plus the learned probe margin under HBM,
    select.probe_margin_gb) is measured next round (step `confirm`); one that OOMs teaches the calibration.

    Probe-led (policy.schedule.probe_led): one probe per memory footprint (select.same_memory): layouts that
    differ only in the dispatcher run the same probe (a flex layout is probed with alltoall, argv.probe_argv), so
    the best rated of them stands for the rest, and what it finds covers them (select.fit_dominated,
    oom_dominated), even a peak too close to HBM to call either way: a sibling's probe would read the same.
    And round 0 (`fit` and `best_step` None, step `round0_spread`): before anything ran, the uncalibrated model's
    band (memfit.DEFAULT_BAND) and its predicted step, with no reach: the memory model is the part of the
    planner least to be trusted exactly where the fastest layouts lie (activations 1.6-3x high on issue 19's
    unseen workloads), and a probe costs one GPU per probed rank for minutes, where a round-0 launch costs N."""
    seen = list(inp.observations) + list(inp.source)
    cut = best_step * (1.0 + policy.search.max_predicted_loss) if best_step is not None else float("inf")
    factors = fit.factors if fit is not None else None
    pool = [
        c
        for c in env.memory_band(fit, factors)
        if not c.prediction.feasible
        and c.key not in inp.known_keys
        and c.key not in taken
        and not oom_dominated(c.layout, seen)
        and not fit_dominated(c.layout, inp.observations)  # known to fit: proposed, not probed
        and plan_probe.unprobeable(c.layout) is None
    ]
    rated = sorted(((r, c) for c in pool if (r := rate(c.layout, c.prediction.step_time_s)) <= cut), key=lambda x: x[0])
    # probe-led: one per memory footprint, the best rated first, none of a footprint a probe already read
    covered = [r.layout for r in inp.observations if r.fidelity == Fidelity.PROBE]
    one_each: list = []
    for _, c in rated:
        if policy.schedule.probe_led and any(same_memory(c.layout, lay) for lay in covered):
            continue
        one_each.append(c)
        covered.append(c.layout)
    if best_step is None:  # round 0: nothing rates them yet, so cover the pruned region's knob values
        chosen = diverse_top(one_each, limit, layout_of=lambda c: c.layout, knobs=ROUND0_PROBE_KNOBS)
    else:
        chosen = one_each[:limit]
    why = "fit-probe: predicted {:.1f} GB, HBM within the model's error band"
    return [rank_probe(env, c, fit, why.format(c.prediction.memory_gb), best_step) for c in chosen]


def run(r: Round) -> None:
    n = r.policy.schedule.fit_probes.per_round
    if r.best is not None and r.fit is not None and n > 0:
        taken = {p.key for p in r.props}
        r.props = probes(r.policy, r.env, r.inp, r.fit, r.best_step, taken, r.rate, limit=n) + r.props


STEP = register(Step("fit_probes", run))
