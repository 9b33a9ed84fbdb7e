"""The price before the spend: what a sweep would run, printed by `sweep --dry-run` and first by every sweep.

Why its own module: the admin who lends the GPUs must see the resolved config, the stage's budget in GPU-hours
and in days of the stage's own cluster, and the first round's layouts with their predicted cost before one
job is submitted, and what the whole sweep is expected to spend (a simulation, sweep/price.py). It plans
round 0 exactly as the driver would (the same searcher and schedule on an empty ledger), reads no ledger and
writes none (the price's simulation only a temporary folder it removes); every cost comes from
orchestrator/core/cost.py. Once a new sweep's ledger is open, `same_stage` adds what another sweep of its
stage there already spent (sweeps never read each other's rows, so a second one measures the same layouts
again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from orchestrator.core import cost
from orchestrator.core.schema import RootConfig
from orchestrator.core.states import Fidelity, SweepStatus
from orchestrator.ledger.ledger import Ledger
from orchestrator.schedule import Schedule, fidelity
from orchestrator.search import make_policy
from orchestrator.search.env import PlanEnv
from orchestrator.search.types import Proposal, RoundInput
from orchestrator.sweep.finalists import gate_price
from orchestrator.sweep.price import SweepPrice, price

HOURS_PER_DAY = 24.0


@dataclass
class Preview:
    """The block: the config line, the budget line, round 0's proposals (each with its predicted GPU-hours)."""

    config: str
    budget_gpu_hours: float
    cluster_days: float  # the budget as days of the stage's N GPUs, all of them busy (cost.cluster_hours / 24)
    budget: str
    proposals: list[Proposal] = field(default_factory=list)
    note: str = ""  # why round 0 may differ from this one (a promoted stage, a continued sweep)
    # probe-led (policy.schedule.probe_led): round 0 only probes, so the first launches at scale are round 1's;
    # priced as round 0's own layouts at scale (what the probes pick among), with how many go
    next_at_scale: list[Proposal] = field(default_factory=list)
    whole: SweepPrice | None = None  # the whole sweep's simulated price (sweep/price.py); None: not asked for
    parity: str = ""  # the finalists' parity gate: its launches and predicted GPU-hours (sweep/finalists.gate_price)

    @property
    def round0_gpu_hours(self) -> float:
        return sum(p.est_gpu_hours for p in self.proposals)

    def lines(self) -> list[str]:
        out = [self.config, self.budget]
        share = self.round0_gpu_hours / self.budget_gpu_hours if self.budget_gpu_hours > 0 else 0.0
        out.append(
            f"round 0: {len(self.proposals)} layout(s), predicted {self.round0_gpu_hours:,.0f} GPU-hours "
            f"({share:.0%} of the budget)" + (f"; {self.note}" if self.note else "")
        )
        for i, p in enumerate(self.proposals, 1):
            seed = "; saves the seed" if p.seed_save else "; loads the seed" if p.after_seed or p.warm_from else ""
            out.append(
                f"  {i}. {p.layout.short()}  {p.fidelity}, predicted step {p.predicted_step_s:.2f} s, "
                f"{p.est_gpu_hours:,.0f} GPU-hours{seed}"
            )
        if self.next_at_scale:
            hours = sum(p.est_gpu_hours for p in self.next_at_scale)
            n = len(self.next_at_scale)
            out.append(
                f"after round 0: the probed layouts that fit, best composed step first, at most {n}"
                f" at scale (the first saves the seed): about {hours:,.0f} GPU-hours priced as round 0's own"
                " layouts at scale"
            )
        if self.parity:
            out.append(self.parity)
        if self.whole is not None:
            out.append(self.whole.line())
        return out


def preview(
    cfg: RootConfig,
    config_yaml: str | None = None,
    sources: Sequence[tuple[RootConfig, str]] = (),
    samples: int = 0,
) -> Preview:
    """What a new sweep of `cfg` would spend and launch first (nothing is launched or written); with `samples`
    > 0 and its `config_yaml`, also the whole sweep's simulated price (sweep/price.py; `sources`: the configs of
    the stages it promotes from, root first, simulated first)."""
    from orchestrator.ledger.engine import mask

    stage = cfg.required_stage()
    hw, budget = cfg.hardware, stage.budget
    nodes = stage.gpus // max(1, stage.gpus_per_node)
    sim = " SIMULATED" if cfg.workload.simulated else ""
    warm = stage.warm_start.warmup_iters
    seeded = f" (the seed's launch; the rest load it: {warm})" if fidelity.warm_start_on(stage) else ""
    config = (
        f"config: stage {stage.name} N={stage.gpus:,} GPUs = {nodes:,} nodes x {stage.gpus_per_node}, "
        f"B={stage.global_batch} S={stage.seq_length}, window {stage.warmup_iters} warm-up{seeded} + "
        f"{stage.measure_iters} measured; model {cfg.model.name}; hardware {hw.name} ({hw.hbm_gb:g} GB); "
        f"workload {cfg.workload.name}{sim}; "
        f"cluster {cfg.cluster.kind}; policy {cfg.policy.name}; ledger {mask(cfg.ledger.url)}"
    )
    days = cost.cluster_hours(budget.max_gpu_hours, stage.gpus) / HOURS_PER_DAY
    line = (
        f"budget: {budget.max_gpu_hours:,.0f} GPU-hours = {days:.1f} days of the stage's {stage.gpus:,} GPUs; "
        f"at most {budget.max_runs} runs and {budget.max_rounds} rounds; start-up {budget.startup_s:g} s per launch"
    )
    env = PlanEnv(cfg.model, hw, stage, cfg.workload.name, cfg.workload.recipe)
    inp = RoundInput(
        round=0, observations=[], known_keys=set(), slots=budget.max_runs, gpu_hours_left=budget.max_gpu_hours
    )
    plan = Schedule(cfg.policy).plan(make_policy(cfg.policy), env, inp)
    after: list[Proposal] = []
    if plan.proposals and all(p.fidelity == Fidelity.PROBE for p in plan.proposals):
        sched = cfg.policy.schedule  # the same schedule without probe-led rounds nor round 0's spread
        steps = [s for s in sched.steps if s != "round0_spread"]
        at_scale = replace(cfg.policy, schedule=replace(sched, probe_led=False, steps=steps))
        after = Schedule(at_scale).plan(make_policy(at_scale), env, inp).proposals
    note = (
        f"the sweep starts from the ledger's latest {stage.promotes_from} winners (shown without them)"
        if stage.promotes_from
        else ""
    )
    whole = price(cfg, config_yaml, sources, samples=samples) if samples > 0 and config_yaml is not None else None
    # the gate runs once the search stops, on the best measured layouts: priced as the first of round 0's layouts
    # at scale, in the schedule's order (the best rated first)
    scale = after or [p for p in plan.proposals if p.fidelity != Fidelity.PROBE]
    gate = gate_price(cfg, [p.layout for p in scale]).line(cfg, "round 0's best at scale")
    return Preview(config, budget.max_gpu_hours, days, line, plan.proposals, note, after, whole, gate)


def same_stage(ledger: Ledger, cfg: RootConfig, name: str, resume: Callable[[str], str]) -> list[str]:
    """A new sweep's warning lines, said before it launches anything: each other sweep of its stage in this
    ledger (the same model, hardware and workload, so the same layouts), newest first, with the layouts it
    measured and the GPU-hours it spent, and the command that continues it instead (`resume(name)`). Not an
    error: a second sweep of a stage is allowed, and measures from scratch (docs/faults.md, "Sweeps of one stage
    never read each other's rows"), which doubled the GPU-hours without a word."""
    from orchestrator import history
    from orchestrator.config import root_from_yaml

    stage = cfg.required_stage()
    others = [
        s
        for s in ledger.list_sweeps()
        if s.name != name
        and (s.stage, s.model, s.hardware, s.workload)
        == (stage.name, cfg.model.name, cfg.hardware.name, cfg.workload.name)
    ]
    lines = []
    for other in reversed(others):
        try:  # its own start-up and windows price its attempts
            own = root_from_yaml(other.config_yaml).required_stage()
        except Exception:  # noqa: BLE001 - a snapshot this code cannot read: priced with this sweep's stage
            own = stage
        spent = history.spent(ledger, other.name, stage=own)
        sim = " simulated" if spent.simulated else ""
        way = (
            f"`python -m orchestrator best --sweep {other.name}` has its answer"
            if other.status == SweepStatus.DONE
            else f"{resume(other.name)} continues it"
        )
        lines.append(
            f"warning: sweep {other.name} of stage {stage.name} (model {cfg.model.name}, hardware {cfg.hardware.name}, "
            f"workload {cfg.workload.name}) already measured {spent.runs} layout(s) in this ledger "
            f"({spent.gpu_hours:,.1f}{sim} GPU-hours); sweep {name} reads none of its rows and measures them again "
            f"(up to {spent.gpu_hours:,.1f} GPU-hours more): {way}"
        )
    return lines
