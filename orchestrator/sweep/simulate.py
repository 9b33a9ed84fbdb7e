"""A sweep driven in-process: the driver's own decisions against a surface whose truth is read in-process.

Why its own module: the price of a whole sweep (orchestrator/sweep/price.py) and the search bench
(tests/bench/searchlib.py) both need the real decision loop, orchestrator/sweep/decide.next_round and the
configured policy on a real SQLite ledger, with only job execution replaced: each claimed candidate is
evaluated on a `Surface` (the per-iteration step times its job would print, the peak memory, or an OOM) and
its JobResult goes through the same Ledger calls a collected job's result goes through (new_attempt,
update_attempt, record_result, then the candidate's status, retried or not by sweep/retry.retry_decision).

Cost, the same as the driver's: one launch costs what orchestrator.core.cost charges it at the true step
(N x (start-up + iterations x step)); a launch that does not fit runs start-up and its first iteration, then
dies (OOM); a rank probe is 1 GPU per probed rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

HOLDER = "bench-search"  # claims in the simulation's ledger


@dataclass(frozen=True)
class Launch:
    """What one launch of a layout does on a target: its true step, whether it fits, the per-iteration
    seconds of the stage window (empty when it does not fit) and its peak memory."""

    step_s: float
    fits: bool
    times: tuple[float, ...]
    peak_gb: float
    stage_gb: tuple[float, ...]
    capacity_gb: float | None = None  # what the GPU holds, as the target's OOM message states it
    stages: tuple[int, ...] = ()  # a rank probe: the PP stage of each probed rank (stage_gb is theirs)


class Surface(Protocol):
    """What a simulated sweep runs its jobs on: a launch at scale, and a one-GPU rank probe of `probe_ranks`."""

    def launch(self, cfg, layout, pattern: str, key: str, attempt: int = 1, window=None) -> Launch: ...

    def probe(
        self, cfg, layout, pattern: str, key: str, probe_ranks: Sequence[int], attempt: int = 1, window=None
    ) -> Launch: ...


def probe_refusal(cfg, layout, pattern: str, window) -> str | None:
    """What dev does with this rank probe's argv (the job's: runspec's flags, argv.probe_argv) under the probe
    mode the sweep's config gives its jobs (workload.probe_mode): its failure text, or None when it runs."""
    from orchestrator.plan import argv as plan_argv
    from orchestrator.plan import probe

    argv = plan_argv.probe_argv(
        plan_argv.megatron_argv(
            cfg.model, cfg.stage, layout, layer_pattern=pattern, train_iters=sum(window), mock_data=True,
            recipe=cfg.workload.recipe,
        )
    )  # fmt: skip
    mode = probe.mode_env(cfg.workload.probe_mode).get(probe.MODE_ENV)
    return probe.refusal(argv, mode)


def launch_gpu_hours(n_gpus: int, startup_s: float, iters: int, launch: Launch) -> float:
    """orchestrator.core.cost's launch at the true step; a launch that does not fit runs one iteration."""
    from orchestrator.core import cost

    return cost.launch_gpu_hours(n_gpus, startup_s, launch.step_s, iters if launch.fits else 1)


def settled_of(times, warmup: int) -> int | None:
    """A launch's settled_iters as collect reports it from its iteration lines (iteration 1 on; the window's
    p50 and noise are its steady step's)."""
    from orchestrator.evidence.metrics import robust_cv, settled_iters, summarize

    window = list(times[warmup:])
    p50 = summarize(window).p50
    return settled_iters(list(enumerate(times, 1)), p50, robust_cv(window)) if p50 else None


def p50_of_window(cfg, launch: Launch, warmup: int | None = None) -> float:
    """The measured step: p50 of the window after warm-up (what collect reports as step_p50_s)."""
    from orchestrator.evidence.metrics import summarize

    p50 = summarize(list(launch.times[cfg.stage.warmup_iters if warmup is None else warmup :])).p50
    return math.nan if p50 is None else float(p50)


@dataclass
class SweepRun:
    """One sweep's path: every launch (round, layout, GPU-hours, measured p50 or None), how it ended."""

    policy: str
    reason: str = ""
    # (round, layout, GPU-hours, measured p50 or None, true step, fidelity, decision batch: a confirm runs a
    # candidate of an earlier round in a later batch)
    launches: list[tuple[int, object, float, float | None, float, str, int]] = field(default_factory=list)
    reported: object | None = None  # the layout the sweep reports as best
    reported_true_s: float = math.inf
    events: list[str] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float:
        return sum(x[2] for x in self.launches)

    def cost_to_goal(self, grid, goal: float = 0.02) -> float:
        """GPU-hours through the end of the first round (decision batch) after which the best FULL-window
        measurement is within `goal` of `grid`'s true best (grid.gap: the bench's;
        a screen ranks, never decides: the same rule as the sweep's own best)."""
        spent, best = 0.0, (math.inf, math.inf)  # (measured p50, true step) of the best so far
        for batch in sorted({x[6] for x in self.launches}):
            for _, _, cost, p50, true_s, fid, _ in (x for x in self.launches if x[6] == batch):
                spent += cost
                if fid == "full" and p50 is not None and p50 < best[0]:
                    best = (p50, true_s)
            if grid.gap(best[1]) <= goal:
                return spent
        return math.inf

    def decision_hours(self, cluster_gpus: int, probe_gpus: int) -> float:
        """Time to the decision (orchestrator.core.cost.decision_hours): full-scale launches on the stage's GPUs
        one after another, rank probes (1-GPU tasks) in parallel on the side pool."""
        from orchestrator.core import cost

        jobs = [(1 if x[5] == "probe" else cluster_gpus, x[2]) for x in self.launches]  # rank probes: 1-GPU tasks
        return max(cost.decision_hours(jobs, cluster_gpus, probe_gpus))

    def gpu_hours_by(self) -> dict[str, float]:
        """GPU-hours per fidelity (probe, screen, full)."""
        out: dict[str, float] = {}
        for x in self.launches:
            out[x[5]] = out.get(x[5], 0.0) + x[2]
        return out


class _Events:
    """The view next_round reports to: keep its lines for the bench's verbose output."""

    def __init__(self, out: list[str]):
        self.out = out

    def event(self, msg: str) -> None:
        self.out.append(msg)


def run_sweep(ledger, cfg, config_yaml: str, target: Surface, name: str, startup_s: float) -> SweepRun:
    """Drive one sweep to its end with orchestrator/sweep/decide.next_round and the configured policy,
    executing each claimed candidate in-process (see the module docstring)."""
    from orchestrator import history
    from orchestrator.core.cost import rank_probe_gpu_hours
    from orchestrator.core.failures import Failure
    from orchestrator.core.paths import CheckpointPaths, JobPaths, atomic_write
    from orchestrator.core.result import JobResult, RankMemory
    from orchestrator.core.states import Fidelity
    from orchestrator.schedule import fidelity
    from orchestrator.schedule.fidelity import decision_window
    from orchestrator.search import make_policy
    from orchestrator.search.env import PlanEnv
    from orchestrator.sweep import seeding
    from orchestrator.sweep.decide import next_round
    from orchestrator.sweep.retry import retry_decision

    st = cfg.stage
    jobs = Path(ledger.url.split(":///", 1)[1]).parent / "jobs" / name  # beside the ledger: the seeds' trackers
    sweep = ledger.create_or_get_sweep(
        name,
        stage=st.name,
        config_yaml=config_yaml,
        model=cfg.model.name,
        hardware=cfg.hardware.name,
        workload=cfg.workload.name,
        provenance={"bench": "search"},
    )
    policy, env = make_policy(cfg.policy), PlanEnv(cfg.model, cfg.hardware, st, cfg.workload.name, cfg.workload.recipe)
    out = SweepRun(policy=cfg.policy.name)
    view = _Events(out.events)
    clock = datetime(2026, 1, 1, tzinfo=UTC)
    batch = 0
    while True:
        batch += 1
        reason = next_round(ledger, cfg, sweep, policy, env, view)
        if reason:
            out.reason = reason
            break
        while claimed := ledger.claim_for_submission(name, 10_000, HOLDER, skip=seeding.waiting(ledger, sweep, st)):
            for c in claimed:
                lay = c.layout
                tried = ledger.attempts(c.id)
                fid, win = decision_window(st, c.decision)  # the window the loop would launch (screen / full)
                probed = list(c.decision.probed_ranks()) if fid == "probe" else []
                refused = probe_refusal(cfg, lay, c.layer_pattern, win) if probed else None
                if refused:  # dev fails this probe at its first pipeline receive (orchestrator/plan/probe.py)
                    run = dataclasses.replace(
                        target.launch(cfg, lay, c.layer_pattern, c.key, attempt=len(tried) + 1, window=win),
                        fits=False,
                        times=(),
                    )
                    cost = rank_probe_gpu_hours(len(probed), startup_s, run.step_s, 1)
                elif probed:  # a one-GPU rank probe of each bounding rank, charged 1 GPU x its time each
                    run = target.probe(cfg, lay, c.layer_pattern, c.key, probed, attempt=len(tried) + 1, window=win)
                    iters = sum(win) if run.fits else 1
                    cost = rank_probe_gpu_hours(len(probed), startup_s, run.step_s, iters)
                else:
                    run = target.launch(cfg, lay, c.layer_pattern, c.key, attempt=len(tried) + 1, window=win)
                    # the early cut, as the driver applies it (sweep/cutoff): its line lowered to the best so far
                    now = history.best_step_s(ledger, name) if c.decision.cut else None
                    line = fidelity.running_line(st, c.decision, now)
                    cut, reach = line.verdict(run.times) if line and run.fits else (None, 0)
                    if line and cut is not None:  # what ran is a screen of the iterations its verdict read
                        fid, win = Fidelity.SCREEN, line.window_at(reach)
                        run = dataclasses.replace(run, times=run.times[:reach])
                    # a warm start's load / save (an OOM never gets to the save, nor does a cut launch)
                    extra = fidelity.startup_s(st, c.decision, measured=run.fits and cut is None) - st.budget.startup_s
                    cost = launch_gpu_hours(st.gpus, startup_s + extra, sum(win), run)
                job_dir = jobs / f"{c.id}-{len(tried) + 1}"
                if run.fits and c.decision.seed_save:  # the seed a job saves after its window
                    atomic_write(CheckpointPaths(JobPaths(job_dir).seed_checkpoint).tracker, str(sum(win)))
                a = ledger.new_attempt(
                    c.id,
                    job_id=f"inproc-{c.id}-{len(tried) + 1}",
                    job_dir=str(job_dir),
                    simulated=True,
                    fidelity=fid,
                )
                end = clock + timedelta(hours=cost / (len(probed) or st.gpus))
                ledger.update_attempt(a.id, start_time=clock, end_time=end, node_list="in-process")
                clock = end
                result = _result(cfg, run, JobResult, RankMemory, pp=lay.pp, window=win)
                if refused:  # as collect reads a probe's crash: PROBE_FAILED, never an OOM
                    result.failure_class, result.failure_detail = Failure.PROBE_FAILED, f"probe: {refused}"
                    result.gpu_capacity_gb, result.gpu_capacity_source = None, ""
                ledger.evidence.record_result(a.id, result.to_dict())
                p50 = p50_of_window(cfg, run, win[0]) if run.fits else None
                out.launches.append((c.round, lay, cost, p50, run.step_s, fid, batch))
                if run.fits:
                    ledger.set_candidate_status(c.id, "done", "measured in-process")
                    continue
                retry, why = retry_decision(
                    result.failure_class or "OOM",
                    [x.failure_class or x.state for x in ledger.attempts(c.id)],
                    max_attempts=cfg.policy.driver.max_attempts,
                    retry_classes=cfg.policy.driver.retry_classes,
                )
                ledger.set_candidate_status(c.id, "planned" if retry else "failed", f"{result.failure_class}: {why}")
    best = history.best_of(ledger, name)
    if best is not None:
        row = ledger.candidate_by_key(name, best["key"])
        out.reported = row.layout
        out.reported_true_s = target.launch(cfg, out.reported, row.layer_pattern, row.key).step_s
    return out


def _result(cfg, run: Launch, JobResult, RankMemory, *, pp: int = 1, window=None):
    """The JobResult `collect` would build from this launch's job folder: the twin prints a memory line per
    pipeline stage; a stand-in prints one, from its one process (RANK = N - 1, the last PP stage)."""
    from orchestrator.evidence.metrics import CAPACITY_FROM_OOM, summarize

    st = cfg.stage
    warmup, measure = window or (st.warmup_iters, st.measure_iters)
    if not run.fits:
        return JobResult(
            ok=False,
            simulated=True,
            failure_class="OOM",
            failure_detail="torch.OutOfMemoryError: CUDA out of memory (in-process evaluation)",
            exit_code=1,
            gpu_capacity_gb=run.capacity_gb,  # the OOM message states it (orchestrator.sweep.capacity reads it)
            gpu_capacity_source=CAPACITY_FROM_OOM if run.capacity_gb else "",
            warmup_iters=warmup,
            measure_iters_requested=measure,
        )
    window = list(run.times[warmup:])
    s = summarize(window)
    mems: list = []
    if run.stages:  # a rank probe: one memory line per probed rank (its PP stage), nothing else
        heaviest = run.stages[max(range(len(run.stage_gb)), key=lambda i: run.stage_gb[i])]
        mems = [
            RankMemory(rank=i, pp_stage=p, allocated_mb=None, reserved_mb=gb * 1e9 / 2**20, source="in-process")
            for i, (p, gb) in enumerate(zip(run.stages, run.stage_gb, strict=True))
        ]
    heaviest = heaviest if run.stages else max(range(len(run.stage_gb)), key=lambda i: run.stage_gb[i])
    tokens = st.global_batch * st.seq_length / s.p50
    return JobResult(
        ok=True,
        simulated=True,
        exit_code=0,
        warmup_iters=warmup,
        measure_iters_requested=measure,
        measure_iters=len(window),
        step_times_s=window,
        step_p50_s=s.p50,
        step_p95_s=s.p95,
        step_p99_s=s.p99,
        step_mean_s=s.mean,
        step_max_s=s.max,
        settled_iters=settled_of(run.times, warmup),
        tokens_per_s=tokens,
        tokens_per_s_per_gpu=tokens / st.gpus,
        heaviest_pp_stage=heaviest,
        peak_reserved_gb=run.peak_gb,
        rank_memory=mems
        if run.stages
        else [
            RankMemory(rank=i, pp_stage=i, allocated_mb=None, reserved_mb=gb * 1e9 / 2**20, source="in-process")
            for i, gb in enumerate(run.stage_gb)
        ]
        if len(run.stage_gb) > 1 or pp == 1
        else [
            RankMemory(  # a stand-in's one figure: the first stage's rank 0, as its memory line says (megatron_io)
                rank=0,
                pp_stage=0,
                allocated_mb=None,
                reserved_mb=run.peak_gb * 1e9 / 2**20,
                source="in-process",
            )
        ],
    )
