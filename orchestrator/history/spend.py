"""What a sweep has spent, read from the ledger: every attempt of every role charged once with
orchestrator/core/cost.py (its own window plus the start-up it paid), the runs the budget counts, the split by
fidelity and round, and the time to a decision. The budget check, `status`, the live view and the report all
read this one figure.

Read-only (orchestrator/history/ writes nothing): recomputed from the ledger on each call, never cached across
rounds, so a resumed driver sees exactly what the killed one had written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.core import cost
from orchestrator.core import windows as fidelity
from orchestrator.core.failures import Failure
from orchestrator.core.schema import ClusterConfig, StageConfig
from orchestrator.core.states import AttemptRole, EventKind, Fidelity
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger


@dataclass
class Spent:
    """Budget consumed by one sweep. GPU-hours are simulated when the workload is (the twin)."""

    runs: int  # candidates measured at least once (screen or full, not an OOM): what max_runs counts
    attempts: int
    gpu_hours: float  # every attempt of every fidelity, and the finalists
    simulated: bool
    by_fidelity: dict[str, float] = field(default_factory=dict)  # probe | screen | full | finalists -> GPU-hours
    by_round: dict[int, float] = field(default_factory=dict)  # candidate round -> GPU-hours (finalists: the last)
    # time to the decision (orchestrator.core.cost.decision_hours): full-scale jobs one after another on the
    # stage's cluster, small probes in parallel on the side pool (cluster.probe_gpus)
    cluster_hours: float = 0.0
    probe_pool_hours: float = 0.0

    @property
    def decision_hours(self) -> float:
        return max(self.cluster_hours, self.probe_pool_hours)


def attempt_cost(stage: StageConfig, a: queries.AttemptCost) -> float:
    """GPU-hours of one attempt (orchestrator.core.cost): its own window's iterations x its measured mean step,
    else the wall time it held its GPUs, plus stage.budget.startup_s for a launch that ran."""
    iters = (a.warmup_iters or 0) + (a.measure_iters or 0)
    if a.step_mean_s and not iters:  # a result without its window: the window its fidelity runs
        iters = sum(fidelity.window(stage, a.fidelity))
    wall = (a.end_time - a.start_time).total_seconds() if a.start_time and a.end_time else None
    gpus = cost.launch_gpus(stage.gpus, a.probed_ranks)  # a rank probe: one GPU per probed rank
    startup = stage.budget.startup_s  # a finalist's job neither loads nor saves a seed
    if a.role == AttemptRole.MEASURE:
        startup = fidelity.startup_s(stage, a.decision, measured=bool(a.step_mean_s))
    return cost.attempt_gpu_hours(gpus, startup, step_mean_s=a.step_mean_s, iterations=iters, wall_s=wall)


def uses_a_run(a: queries.AttemptCost) -> bool:
    """A measurement uses up one of stage.budget.max_runs; a fit probe (a few iterations, to read the peak) and
    an OOM (start-up and one iteration: it teaches the memory model) do not, so a GPU that holds less than
    the config says cannot spend the sweep's runs on layouts that never measured anything. Their GPU-hours
    still count against max_gpu_hours."""
    return a.role == AttemptRole.MEASURE and a.fidelity != Fidelity.PROBE and a.failure_class != Failure.OOM


def spent(ledger: Ledger, sweep: str, *, stage: StageConfig, probe_gpus: int | None = None) -> Spent:
    """runs = candidates with a measurement that is not a probe nor an OOM (`uses_a_run`); GPU-hours =
    `attempt_cost` of every attempt of every fidelity and role
    (the finalists' parity and long-run jobs are attempts of their own roles, charged under "finalists"; a sweep
    older than revision 0009 adds what its finalist-cost events recorded). The budget check, `status`, the live
    view and the report all read this one figure."""
    costs = queries.attempt_costs(ledger, sweep)
    by: dict[str, float] = {}
    by_round: dict[int, float] = {}
    jobs: list[tuple[int, float]] = []
    for a in costs:
        gpu_h = attempt_cost(stage, a)
        jobs.append((cost.launch_gpus(stage.gpus, a.probed_ranks), gpu_h))  # a rank probe: on the side pool
        f = str(a.fidelity) if a.role == AttemptRole.MEASURE else "finalists"
        by[f] = by.get(f, 0.0) + gpu_h
        by_round[a.round] = by_round.get(a.round, 0.0) + gpu_h
    fin = finalist_gpu_hours(ledger, sweep)  # finalists' jobs of sweeps run before they were attempts
    if fin:
        by["finalists"] = by.get("finalists", 0.0) + fin
        last = max(by_round, default=0)
        by_round[last] = by_round.get(last, 0.0) + fin
        jobs.append((stage.gpus, fin))
    pool = ClusterConfig().probe_gpus if probe_gpus is None else probe_gpus  # the schema owns the default
    full_h, pool_h = cost.decision_hours(jobs, stage.gpus, pool)
    return Spent(
        runs=len({a.candidate_id for a in costs if uses_a_run(a)}),
        attempts=len(costs),
        gpu_hours=sum(by.values()),
        simulated=any(a.simulated for a in costs),
        by_fidelity={str(k): v for k, v in by.items()},
        by_round=by_round,
        cluster_hours=full_h,
        probe_pool_hours=pool_h,
    )


def fidelity_split(by: dict[str, float]) -> str:
    """' (probe 1.0, screen 2.0, full 3.0, finalists 0.5)': where the GPU-hours went, per fidelity."""
    order = (*Fidelity, "finalists")
    parts = [f"{k} {by[k]:.1f}" for k in order if by.get(k)]
    return f" ({', '.join(parts)})" if parts else ""


def finalist_gpu_hours(ledger: Ledger, sweep: str) -> float:
    """GPU-hours the finalists' jobs (parity, long-run) recorded in their events (data.gpu_hours)."""
    return sum(
        float((e.data or {}).get("gpu_hours") or 0.0) for e in ledger.events(sweep, kind=EventKind.FINALIST_COST)
    )
