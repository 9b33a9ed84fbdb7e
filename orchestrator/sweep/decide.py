"""Deciding the next round: stop (budget, rounds, convergence, nothing left) or add the round the schedule makes
of the searcher's proposals (orchestrator/schedule: fidelities, confirmations, probes, the round's size).

Everything is read from the ledger at the moment of deciding, so a resumed orchestrator decides exactly
what the killed one would have; the calibration is recorded once per round.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from orchestrator import history
from orchestrator.core.schema import RootConfig
from orchestrator.core.states import CandidateStatus, EventKind
from orchestrator.ledger.ledger import CandidateIn, Ledger, SweepRow
from orchestrator.schedule import Schedule
from orchestrator.search.env import PlanEnv
from orchestrator.search.types import RoundInput
from orchestrator.sweep import capacity
from orchestrator.sweep.faults import fault_point
from orchestrator.sweep.setup import promotion_source, recorded_source


def next_round(
    ledger: Ledger, cfg: RootConfig, sweep: SweepRow, policy, env: PlanEnv, view, schedule: Schedule | None = None
) -> str | None:
    """None when a new round was added (or something is still queued); else why the sweep stops. The searcher
    (`policy`) proposes layouts, the schedule (orchestrator/schedule) their fidelities and the round's size."""
    schedule = schedule or Schedule(cfg.policy)
    cands = ledger.candidates(sweep.name)
    if any(c.status in CandidateStatus.LIVE for c in cands):
        return None  # something is still queued (e.g. a retry): keep waiting
    env = capacity.plan_env(ledger, sweep.name, env, view)  # what the GPUs hold, as the jobs said, beats hbm_gb
    budget = cfg.required_stage().budget
    spent = history.spent(ledger, sweep.name, stage=cfg.required_stage())
    rnd = max((c.round for c in cands), default=-1) + 1
    sims = " simulated" if spent.simulated else ""
    if rnd >= budget.max_rounds:
        return f"max_rounds {budget.max_rounds} reached"
    if spent.runs >= budget.max_runs:
        return f"budget spent: {spent.runs}/{budget.max_runs} runs"
    if spent.gpu_hours >= budget.max_gpu_hours:
        return f"budget spent: {spent.gpu_hours:.1f}/{budget.max_gpu_hours:.0f}{sims} GPU-hours"
    # Only this sweep's rows: another sweep of the stage (same keys) is never read, neither its measurements
    # nor its screens (issue 22: a second confirm once quoted the other sweep's p50). A sweep learns from
    # another only by promotion, from the source it names by id (setup.promotion_source).
    obs = history.observations(ledger, [sweep], env)
    cv = history.step_cv(ledger, [sweep])
    source, source_stage = [], None
    promotion = promotion_source(ledger, cfg, sweep) if rnd == 0 else None  # None: the stage promotes from none
    # the routing-settled weights later launches load (stage.warm_start): this sweep's, else its source's
    seed = history.seed(ledger, sweep)
    if seed is None and (src := promotion[0] if promotion else recorded_source(ledger, sweep)) is not None:
        seed = history.seed(ledger, src)
    seedless = seed is None and history.seedless(ledger, sweep) is not None
    if promotion is not None:
        src_sweep, src_cfg = promotion
        src_env = PlanEnv(
            src_cfg.model, src_cfg.hardware, src_cfg.required_stage(), src_cfg.workload.name, src_cfg.workload.recipe
        )
        source, source_stage = history.observations(ledger, [src_sweep], src_env), src_cfg.stage
        view.event(f"promoting from sweep {src_sweep.name} ({len([s for s in source if s.ok])} measured)")
    inp = RoundInput(
        round=rnd,
        observations=obs,
        known_keys=history.known_keys(ledger, sweep),
        slots=budget.max_runs - spent.runs,
        gpu_hours_left=budget.max_gpu_hours - spent.gpu_hours,
        source=source,
        step_cv=cv,
        seed=seed,
        seedless=seedless,
        settled=history.settled(ledger, [sweep]),
    )
    plan = schedule.plan(policy, env, inp, source_stage=source_stage)
    # a step may hold convergence (plan.held: a layout its nearest measurement says beats the best, unmeasured)
    if (
        policy.converged(obs, budget.converge_rounds)
        and not schedule.waiting(inp, plan.fit, plan.rate)
        and not plan.held
    ):
        return policy.converged_reason(budget.converge_rounds)
    if plan.fit is not None and not any(cal.round == rnd for cal in ledger.evidence.calibrations(sweep.name)):
        f = plan.fit
        ledger.evidence.record_calibration(
            sweep.name,
            rnd,
            f.to_dict(),
            {
                "step_mape_before": f.mape_before,
                "step_mape_after": f.mape_after,
                "step_loo_mape": f.loo_mape,
                "memory_mape_before": f.memory_mape_before,
                "memory_mape_after": f.memory_mape_after,
            },
        )
        view.event(
            f"round {rnd} calibration ({f.method}, {f.n_step} runs): step MAPE "
            f"{_pct(f.mape_before)} -> {_pct(f.mape_after)}, {f.memory_summary()}"
        )
    by_key = {c.key: c for c in cands}
    plan.confirms = [p for p in plan.confirms if p.key in by_key]  # a confirm re-runs this sweep's own screen
    if not plan.proposals and not plan.confirms:
        return "search exhausted: the policy has nothing new to measure within the budget"

    ledger.record_round(  # ONE transaction: the re-queued contenders, the new candidates, the round's event
        sweep.name,
        # a screened contender runs again at the full window: same candidate, new attempt
        requeues=[
            (by_key[p.key].id, p.decision().but(previous=by_key[p.key].decision), p.reason) for p in plan.confirms
        ],
        items=[
            CandidateIn(
                key=p.key,
                layout=p.layout,
                layer_pattern=p.predicted.get("layer_pattern", ""),
                predicted=p.predicted,
                round=rnd,
                parent_key=p.parent_key,
                edge_kind=p.edge_kind,
                decision=p.decision(),
            )
            for p in plan.proposals
        ],
        event=(
            EventKind.ROUND,
            f"round {rnd}: {plan.reason}",
            {
                "round": rnd,
                "keys": [p.key for p in plan.proposals],
                "reasons": [p.reason for p in plan.proposals],
                "fidelities": [p.fidelity for p in plan.proposals],
                "layouts": [p.layout.short() for p in plan.proposals],
                "predicted_step_s": [p.predicted_step_s for p in plan.proposals],
                "confirms": [p.key for p in plan.confirms],
                "step_cv": cv,
                "held": list(plan.held),  # what held convergence this round (a step's unmeasured disputed layouts)
            },
        ),
        # a split needs both halves: tests kill there (ORCH_FAULT=round-decision:kill) only in such a round
        between=(lambda: fault_point("round-decision")) if plan.confirms and plan.proposals else None,
    )
    view.event(round_line(rnd, sweep.name, plan.proposals, plan.confirms))
    return None


def round_line(rnd: int, name: str, proposals: Sequence, confirms: Sequence) -> str:
    """The round in one short line (issue 49 item 6: one line per layout ran to 2,000 characters in a log): how
    many layouts at which fidelity and why; each layout with its reason and predicted step is the round's ledger
    event (`ledger events --sweep NAME --format json`)."""
    fid = Counter(str(p.fidelity) for p in proposals)
    why = Counter(str(p.reason).split(":", 1)[0].split(" ", 1)[0] for p in proposals)
    parts = [f"{len(proposals)} layout(s) (" + ", ".join(f"{n} {k}" for k, n in sorted(fid.items())) + ")"]
    if confirms:
        parts.append(f"{len(confirms)} confirm(s) at the full window")
    if why:
        parts.append("by " + ", ".join(f"{k} {n}" for k, n in why.most_common(4)))
    return f"round {rnd}: " + "; ".join(parts) + f" (each: ledger events --sweep {name} --format json)"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"
