"""Step `probe_first`: new layouts as one-GPU rank probes before any launch at scale. After round 0 the
searcher's first policy.schedule.probe_first.direct_per_round proposals go at scale and the rest are probed; a
probe-led round 0 (policy.schedule.probe_led) probes every one (`seed_on_evidence`); otherwise round 0 probes all
but its first round0_full. A probed layout is measured at scale once its composed step (the probe's measured
compute + the calibrated communication, orchestrator/search/compose.py) passes (schedule/round.passed)."""

from __future__ import annotations

from orchestrator.core.schema import PolicyConfig
from orchestrator.plan import probe as plan_probe
from orchestrator.schedule import fidelity
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round, as_probe
from orchestrator.search.env import PlanEnv
from orchestrator.search.types import Proposal, RoundInput


def seed_on_evidence(policy: PolicyConfig, env: PlanEnv, inp: RoundInput) -> bool:
    """Round 0 rank-probes every layout before any launch at scale (policy.schedule.probe_led), so round 1's
    launches are the probed fits best composed step first (`passed`), and the one that saves the seed is the
    fastest the evidence knows. Why: that launch runs the stage's whole warm-up (300 iterations at 1k against
    a warm launch's 50), and the uncalibrated model's favourite, which saved it before, was up to 4x slower
    than the stage's best on unseen twin surfaces (10-16k of a 1k sweep's GPU-hours). A promoted stage too:
    the source's winner was measured on the source's GPU count, its mappings here are cold launches the
    memory model placed, and without this the stage leaned on how much of its region the source's ledger
    covered (docs/search-log.md "Round 0 on evidence", fresh seeds 104-111: 8k missed 5 of 16 rows after a
    probe-led 1k, 0 of 16 with it; on the tune set two 8k rows miss with it). Only where the warm start is on."""
    return policy.schedule.probe_led and inp.round == 0 and fidelity.warm_start_on(env.stage)


def probe_first(env: PlanEnv, p: Proposal) -> Proposal:
    """A new layout as a rank probe (the ranks that bound it, ranks.probe_ranks, one GPU each): its
    compute-only step composes its prediction before a launch at scale is spent on it (`passed`). A layout no
    probe can run as its job does (orchestrator/plan/probe.unprobeable) stays a launch at scale."""
    why_not = plan_probe.unprobeable(p.layout)
    if why_not is not None:
        p.reason += f" (not probed: {why_not})"
        return p
    bound = as_probe(env, p)
    p.reason += f" (probe first: ranks {', '.join(map(str, bound))} on one GPU each)"
    return p


def run(r: Round) -> None:
    cfg, env, inp = r.policy.schedule.probe_first, r.env, r.inp
    if r.best is not None and r.fit is not None and inp.round > 0:
        # the searcher's best few at scale, as ever; the rest probed before any launch at scale
        r.props = r.props[: cfg.direct_per_round] + [probe_first(env, p) for p in r.props[cfg.direct_per_round :]]
    elif seed_on_evidence(r.policy, env, inp):
        r.props = [probe_first(env, p) for p in r.props]  # round 1 measures the best composed at scale
    elif cfg.round0_full and inp.round == 0:  # the first few at scale
        r.props = r.props[: cfg.round0_full] + [probe_first(env, p) for p in r.props[cfg.round0_full :]]


STEP = register(Step("probe_first", run))
