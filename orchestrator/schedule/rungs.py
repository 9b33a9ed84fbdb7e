"""The schedule: at which fidelity each layout of a round is measured, and how many fit in the round.

Why apart from the searcher (as Ray Tune keeps its searcher apart from its trial scheduler): a searcher
(orchestrator/search/policies.py) only ranks and proposes layouts; the rungs (probe, screen, full) and the
round's size and budget are the same decision whatever searched. So every searcher, `predicted_topk`
included, gets multi-fidelity rounds.

A round is the policy's steps in order (policy.schedule.steps; each one module under schedule/steps/,
registered in schedule/registry.py, with its own settings under policy.schedule.<name>): confirmations of what
the sweep already earned, the searcher's proposals, their screens, probe first, fit probes, round 0's spread,
coverage probes, the warm start, early cuts and the round's budget. Each step reads and extends one `Round`
(schedule/round.py).

The driver (orchestrator/sweep/decide.py) calls `Schedule.plan`, and `Schedule.waiting` (with that round's fit)
once the searcher's own convergence test says it is done.
"""

from __future__ import annotations

from orchestrator.core.schema import PolicyConfig, StageConfig
from orchestrator.schedule import fidelity, registry
from orchestrator.schedule.round import Round, passed, screening
from orchestrator.search.calibrate import Fit
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import best_measured
from orchestrator.search.types import Rate, RoundInput, RoundPlan, unrated


class Schedule:
    """The steps of one sweep's rounds, from `policy.schedule` (and `stage.screen.*`: windows, confirms)."""

    def __init__(self, cfg: PolicyConfig):
        self.cfg = cfg
        self.steps = registry.steps(cfg.schedule.steps)

    def plan(self, searcher, env: PlanEnv, inp: RoundInput, *, source_stage: StageConfig | None = None) -> RoundPlan:
        """One round: each step in turn on the searcher's fit and rating (default order: confirmations first,
        then the searcher's proposals, screened once noise is measured, probes ahead of them, all trimmed to
        the round's slots and the GPU-hours left)."""
        fit = searcher.fit(env, inp)
        rate = searcher.estimate(inp, fit)
        r = Round(
            policy=self.cfg,
            searcher=searcher,
            env=env,
            inp=inp,
            source_stage=source_stage,
            fit=fit,
            rate=rate,
            screening=screening(env, inp),
            best=best_measured(inp.observations),
            learned=fidelity.learned_warmup(env.stage, inp.settled),
        )
        for step in self.steps:
            step.run(r)
        props, confirms, learned = r.props, r.confirms, r.learned
        why = f"{len(props)} proposals" + (f" screened, {len(confirms)} confirmed" if r.screening or confirms else "")
        if learned is not None and any(p.warmup_iters is not None for p in [*confirms, *props]):
            why += (
                f"; warm-up {learned} iterations, learned from {len(inp.settled)} warm launches (settled after"
                f" at most {max(inp.settled)}; configured warm_start.warmup_iters {env.stage.warm_start.warmup_iters})"
            )
        return RoundPlan(
            proposals=props,
            fit=fit,
            reason=f"{why} ({searcher.name})",
            confirms=confirms,
            rate=rate,
            held=tuple(r.held),
        )

    def waiting(self, inp: RoundInput, fit: Fit | None, rate: Rate = unrated) -> bool:
        """The sweep has not converged while a measurement it has already earned is still due: a screened
        contender's full-window confirmation, or the launch at scale of a layout a rank probe found to fit (or
        too close to call) whose composed step, as the searcher rates it, is within policy.schedule.probe_pass of
        the best (schedule/round.passed). Why the probed ones: a probe of the last rounds is evidence the search
        paid for, and a sweep that stopped on its stale rounds never measured it; on the bench that cost fresh
        twin:overpredicted s119 its 1k optimum (15.4% short) and the tune set's twin:imbalance its 8k one (12.6%
        short), and no row was lost by waiting (docs/search-log.md "Probed layouts hold convergence"). A probed layout
        holds it as the probed layouts measured at scale before it say its composed step reads (round.passed
        `holding`: three rounds more on held-out twin:mixed s114 1k, docs/search-log.md "A running line and the
        probe's bias")."""
        if fidelity.contenders(inp.observations, inp.step_cv, 1):
            return True
        return bool(passed(self.cfg, inp, fit, rate, holding=True))
