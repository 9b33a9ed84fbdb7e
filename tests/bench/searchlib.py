"""The search-efficiency harness behind tests/bench/bench_search.py: targets, cost, the grid, random search,
and the real sweep decision loop driven against an in-process surface.

Targets are surfaces whose truth the harness can read in-process: the twin's named surfaces
(orchestrator/job/twin/truth,
`workload.twin.surface` + seed) and the external stand-ins in tests/workloads/ (their `evaluate(point)`).

The sweep is the product's own decision logic: orchestrator/sweep/decide.next_round (budget, rounds,
convergence, calibration records) and the configured policy, reading a real SQLite ledger. Only job
execution is replaced: each claimed candidate is evaluated in-process on the target (the per-iteration
step times its job would print, the peak memory, or an OOM) and its JobResult goes through the same Ledger
calls a collected job's result goes through (new_attempt, update_attempt, record_result, then the candidate's
status, retried or not by orchestrator/sweep/retry.retry_decision). So a sweep takes seconds, not hours.

Cost, the same for every method: one launch costs what orchestrator.core.cost charges it at the true step
(N x (start-up + iterations x step)); a launch that does not fit runs start-up and its first iteration, then
dies (OOM).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path

import numpy as np

from orchestrator.core.decision import Decision

ROOT = Path(__file__).resolve().parent.parent.parent
WORKLOADS = ROOT / "tests" / "workloads"
GOAL_GAP = 0.02  # reported best within 2% of the true best
HOLDER = "bench-search"  # claims in the bench ledger


@cache
def _load(path: Path):
    """A stand-in's module, loaded once (its folder on sys.path for megatron_io)."""
    if str(WORKLOADS) not in sys.path:
        sys.path.insert(0, str(WORKLOADS))
    spec = importlib.util.spec_from_file_location(f"workload_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------------ targets
# The rule v4.full_recompute_hash_mhc lifted (orchestrator.plan.rules): a stand-in Megatron that carries the fix.
FIXED_MEGATRON = ["++stage.lifted_rules=[v4.full_recompute_hash_mhc]"]


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


@dataclass(frozen=True)
class Target:
    """A surface to search: `twin:<surface>` (seeded) or `ext:<stand-in>` (tests/workloads/<name>.py)."""

    name: str
    seed: int = 0
    extra: tuple[str, ...] = ()  # more Hydra overrides (e.g. a GPU smaller than its hardware group)

    @property
    def kind(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def label(self) -> str:
        return self.name.split(":", 1)[1]

    def overrides(self) -> list[str]:
        """What makes the sweep's config describe this target (its workload), as Hydra overrides, on the space
        of a Megatron with the fix of PR #6704 (FIXED_MEGATRON): the search is benchmarked where full
        recompute is legal, as its figures were measured."""
        if self.kind == "twin":
            return [
                *FIXED_MEGATRON,
                f"workload.twin.surface={self.label}",
                f"workload.twin.seed={self.seed}",
                *self.extra,
            ]
        script = WORKLOADS / f"{self.label}.py"
        return [
            *FIXED_MEGATRON,
            f"workload.command=[python,{script}]",
            f"workload.name={self.label}",
            "workload.simulated=true",
            *self.extra,
        ]

    def launch(self, cfg, layout, pattern: str, key: str, attempt: int = 1, window=None) -> Launch:
        """Run one layout for a window (warm-up, measured iterations; the stage's by default), in-process: the
        same step times the job would print (the twin's draws are seeded by its key and attempt, as in the job)."""
        iters = sum(window) if window else cfg.stage.warmup_iters + cfg.stage.measure_iters
        if self.kind == "twin":
            from orchestrator.job.twin import truth
            from orchestrator.job.twin.job import steps_rng

            tw = dataclasses.replace(cfg.workload.twin, surface=self.label, seed=self.seed)
            s = truth.evaluate(truth.Case(cfg.model, cfg.hardware, cfg.stage, tw, layout, pattern))
            cap = truth.capacity_gb(cfg.hardware, tw)
            fits = max(s.stage_gb) <= cap
            times = tuple(truth.step_times(s, iters, steps_rng(tw.seed, key, attempt))) if fits else ()
            return Launch(s.step_s, fits, times, max(s.stage_gb), tuple(s.stage_gb), cap)
        mod = _load(WORKLOADS / f"{self.label}.py")
        import megatron_io

        st = cfg.stage
        rc = "full" if "full" in layout.recompute else ("+".join(sorted(layout.recompute)) or "none")
        point = megatron_io.Point(
            n=st.gpus,
            pp=layout.pp,
            vpp=layout.vpp,
            cp=layout.cp,
            ep=layout.ep,
            mbs=layout.mbs,
            gbs=st.global_batch,
            seq=st.seq_length,
            recompute=rc,
            dispatcher=layout.dispatcher_label,
            gpus_per_node=st.gpus_per_node,
        )
        step, mem = mod.evaluate(point)
        cap = megatron_io.hbm_gb(mod.HBM_VAR, mod.HBM_DEFAULT)
        fits = mem <= cap
        times = tuple(megatron_io.step_times(step, iters)) if fits else ()
        return Launch(step, fits, times, mem, (mem,), cap)

    def probe(self, cfg, layout, pattern: str, key: str, probe_ranks, attempt: int = 1, window=None) -> Launch:
        """A one-GPU rank probe of `probe_ranks` (the job's `--fake-process-group` path, in-process): each rank's
        own memory without NCCL and dispatcher buffers, its compute-only step; fits when every probed rank
        does. step_s is the slowest probed rank's (each is charged as 1 GPU x its time); the step times are the
        last rank's, as in the job folder: only the last rank prints Megatron's iteration lines (the twin's
        loop.is_last_rank), so its compute-only p50 is all a probe measures of speed."""
        from orchestrator.plan import ranks as plan_ranks

        iters = sum(window) if window else cfg.stage.warmup_iters + cfg.stage.measure_iters
        if self.kind == "twin":
            from orchestrator.job.twin import truth
            from orchestrator.job.twin.job import steps_rng

            tw = dataclasses.replace(cfg.workload.twin, surface=self.label, seed=self.seed)
            s = truth.evaluate(truth.Case(cfg.model, cfg.hardware, cfg.stage, tw, layout, pattern))
            cap = truth.capacity_gb(cfg.hardware, tw)
            stages = tuple(plan_ranks.coords(layout, cfg.stage.gpus, r)["pp"] for r in probe_ranks)
            views = [truth.rank_probe(s, p) for p in stages]
            gb = tuple(v.stage_gb[0] for v in views)
            fits = max(gb) <= cap
            slow = max(views, key=lambda v: v.step_s)
            printing = views[list(probe_ranks).index(max(probe_ranks))]  # rank N - 1 prints the iteration lines
            times = tuple(truth.step_times(printing, iters, steps_rng(tw.seed, key, attempt))) if fits else ()
            return Launch(slow.step_s, fits, times, max(gb), gb, cap, stages)
        _load(WORKLOADS / f"{self.label}.py")  # puts megatron_io on sys.path: a probe may come before any launch
        import megatron_io

        from orchestrator.plan.argv import PROBE_DISPATCHER

        # the job's probe argv runs a flex layout with alltoall (argv.probe_argv): the stand-in sees that layout
        flex = layout.dispatcher == "flex"
        seen = dataclasses.replace(layout, dispatcher=PROBE_DISPATCHER, flex_backend=None) if flex else layout
        full = self.launch(cfg, seen, pattern, key, attempt, window)
        step, mem = megatron_io.probe(full.step_s, full.peak_gb)
        cap = full.capacity_gb or mem
        fits = mem <= cap
        times = tuple(megatron_io.step_times(step, iters)) if fits else ()
        # a stand-in knows one figure, the first stage's rank 0's, and only that rank prints it (megatron_io);
        # rank 0 is always probed (plan/ranks.probe_ranks: the first stage's DP-rank 0)
        assert 0 in probe_ranks, probe_ranks
        return Launch(step, fits, times, mem, (mem,), cap, (0,))


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

    return float(summarize(launch.times[cfg.stage.warmup_iters if warmup is None else warmup :]).p50)


# --------------------------------------------------------------------------------------------------- grid
@dataclass
class Grid:
    """Every legal layout of the stage (Megatron's rules, any memory), as the target runs it."""

    layouts: list
    keys: list[str]  # the ledger's keys (canonical_key: layout, model, stage, hardware, workload)
    patterns: list[str]
    true_s: np.ndarray  # true step; inf where the layout does not fit
    measured_s: np.ndarray  # measured p50 of one launch; inf where it does not fit
    cost: np.ndarray  # GPU-hours of one launch (warm-started from the seed when stage.warm_start is on)
    launches: list[Launch]
    # what a launch costs more as the first of its run (stage.warm_start: no seed yet, it waits out the stage's
    # own warm-up and saves one): random search and the grid pay it once, as the sweep's round 0 does
    first_extra: np.ndarray | None = None
    # the learned warm-up (schedule/fidelity.learned_warmup), as the sweep learns it: each launch's settled_iters
    # (nan: it did not fit), the GPU-hours one iteration of it costs, the warm-up its cost was charged at, and
    # the rule: random search and the grid save what a shorter learned warm-up saves, as the sweep does
    settled: np.ndarray | None = None
    per_iter: np.ndarray | None = None
    warm_warmup: int = 0
    learned: Callable[[Sequence[int]], int | None] | None = None
    teach: int = 0  # launches of any order that save nothing: the seed's and the warm ones before learn_after

    def warmup_after(self, settled: Sequence[int]) -> int:
        """The warm-up a warm launch runs once these warm launches measured their settled_iters."""
        w = self.learned(settled) if self.learned else None
        return self.warm_warmup if w is None else w

    @property
    def best(self) -> int:
        return int(np.argmin(self.true_s))

    @property
    def best_s(self) -> float:
        return float(self.true_s[self.best])

    @property
    def exhaustive_gpu_hours(self) -> float:
        """Every layout once, in the dearest order: the first saves the seed, the next few warm up as configured
        until they taught the learned warm-up, and the rest save what all of them teach (the learned warm-up
        from every fitting launch: the longest any order learns)."""
        saved = 0.0
        if self.settled is not None and self.per_iter is not None:
            w = self.warmup_after([int(x) for x in self.settled[np.isfinite(self.settled)]])
            cheapest = np.sort(self.per_iter)[: max(0, len(self.per_iter) - self.teach)]
            saved = float((self.warm_warmup - w) * cheapest.sum())
        return float(self.cost.sum() - saved + (self.first_extra.max() if self.first_extra is not None else 0.0))

    def gap(self, true_s: float) -> float:
        return true_s / self.best_s - 1.0


def build_grid(cfg, target: Target, startup_s: float) -> Grid:
    from orchestrator.core.states import Fidelity
    from orchestrator.plan import planner
    from orchestrator.schedule import fidelity

    hw = dataclasses.replace(cfg.hardware, hbm_gb=math.inf)
    st = cfg.stage
    legal = planner.plan(cfg.model, hw, st, workload=cfg.workload.name).candidates
    launches = [target.launch(cfg, c.layout, c.prediction.layer_pattern, c.key) for c in legal]
    cold = np.array([launch_gpu_hours(st.gpus, startup_s, st.warmup_iters + st.measure_iters, x) for x in launches])
    cost, first_extra, learn = cold, None, {}
    if fidelity.warm_start_on(st):  # the same launches as the sweep's: the first saves the seed, the rest load it
        warm_iters = sum(fidelity.window(st, Fidelity.FULL, warm=True))
        load_s = fidelity.startup_s(st, Decision(after_seed=True)) - st.budget.startup_s  # what reading the seed adds
        save_s = fidelity.startup_s(st, Decision(seed_save=True)) - st.budget.startup_s  # ... and writing it
        cost = np.array([launch_gpu_hours(st.gpus, startup_s + load_s, warm_iters, x) for x in launches])
        saving = np.array([launch_gpu_hours(st.gpus, save_s, 0, x) if x.fits else 0.0 for x in launches])
        first_extra = cold + saving - cost
        w_warm = fidelity.window(st, Fidelity.FULL, warm=True)[0]
        settled = np.array([settled_of(x.times, w_warm) if x.fits else None for x in launches], dtype=float)
        per_iter = np.array([launch_gpu_hours(st.gpus, 0.0, 1, x) if x.fits else 0.0 for x in launches])
        learn = {
            "settled": settled,
            "per_iter": per_iter,
            "warm_warmup": w_warm,
            "learned": lambda xs: fidelity.learned_warmup(st, xs),
            "teach": 1 + st.warm_start.learn_after,
        }
    return Grid(
        layouts=[c.layout for c in legal],
        keys=[c.key for c in legal],
        patterns=[c.prediction.layer_pattern for c in legal],
        true_s=np.array([x.step_s if x.fits else math.inf for x in launches]),
        measured_s=np.array([p50_of_window(cfg, x) if x.fits else math.inf for x in launches]),
        cost=cost,
        launches=launches,
        first_extra=first_extra,
        **learn,
    )


# ------------------------------------------------------------------------------------------------ random
@dataclass
class RandomSearch:
    """Random orders over the grid, one launch at a time; the reported best is the best measured so far."""

    cum_cost: np.ndarray  # orders x launches
    gap: np.ndarray  # orders x launches: true gap of the reported best after each launch (inf: none fits yet)

    @property
    def cost_to_goal(self) -> np.ndarray:
        """GPU-hours each order spends until its reported best is within GOAL_GAP."""
        hit = self.gap <= GOAL_GAP
        first = np.argmax(hit, axis=1)
        return np.where(hit.any(axis=1), self.cum_cost[np.arange(len(first)), first], np.inf)

    def gap_at(self, budget: float) -> np.ndarray:
        """Each order's reported gap once it has spent at most `budget` GPU-hours."""
        n = (self.cum_cost <= budget).sum(axis=1)
        return np.where(n > 0, self.gap[np.arange(len(n)), np.maximum(n - 1, 0)], np.inf)


def random_search(grid: Grid, orders: int, seed: int) -> RandomSearch:
    rng = np.random.default_rng(seed)
    n = len(grid.layouts)
    perms = np.argsort(rng.random((orders, n)), axis=1)
    meas = grid.measured_s[perms]
    runmin = np.minimum.accumulate(meas, axis=1)
    pos = np.where((meas == runmin) & np.isfinite(meas), np.arange(n), -1)
    last = np.maximum.accumulate(pos, axis=1)  # position of the reported best so far (-1: none yet)
    reported = perms[np.arange(orders)[:, None], np.maximum(last, 0)]
    gap = np.where(last >= 0, grid.true_s[reported] / grid.best_s - 1.0, np.inf)
    cost = grid.cost[perms]
    if grid.settled is not None and grid.per_iter is not None:  # later launches warm up what earlier ones taught
        cost = cost - learned_saving(grid, perms)
    cum = np.cumsum(cost, axis=1)
    if grid.first_extra is not None:  # each order's first launch saves the seed the others load
        cum = cum + grid.first_extra[perms[:, 0]][:, None]
    return RandomSearch(cum_cost=cum, gap=gap)


def learned_saving(grid: Grid, perms: np.ndarray) -> np.ndarray:
    """orders x launches: what each launch of each random order saves on the warm-up the launches before it
    taught (position 0 saves the seed and runs cold; the sweep learns round by round, random launch by launch)."""
    assert grid.settled is not None and grid.per_iter is not None
    s = grid.settled[perms]
    out = np.zeros(perms.shape)
    memo: dict[tuple[int, int], int] = {}
    for o in range(perms.shape[0]):
        n, top = 0, -1  # warm launches that measured it so far, and the most any needed
        for j in range(1, perms.shape[1]):
            key = (n, top)
            if key not in memo:  # learned_warmup reads only how many and the most
                memo[key] = grid.warmup_after([top] * n)
            out[o, j] = (grid.warm_warmup - memo[key]) * grid.per_iter[perms[o, j]]
            if np.isfinite(s[o, j]):
                n, top = n + 1, max(top, int(s[o, j]))
    return out


# ------------------------------------------------------------------------------------------------- sweep
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

    def cost_to_goal(self, grid: Grid) -> float:
        """GPU-hours through the end of the first round (decision batch) after which the best FULL-window
        measurement is within GOAL_GAP (a screen ranks, never decides: the same rule as the sweep's own best)."""
        spent, best = 0.0, (math.inf, math.inf)  # (measured p50, true step) of the best so far
        for batch in sorted({x[6] for x in self.launches}):
            for _, _, cost, p50, true_s, fid, _ in (x for x in self.launches if x[6] == batch):
                spent += cost
                if fid == "full" and p50 is not None and p50 < best[0]:
                    best = (p50, true_s)
            if grid.gap(best[1]) <= GOAL_GAP:
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


def run_sweep(ledger, composed, target: Target, name: str, startup_s: float) -> SweepRun:
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

    cfg = composed.cfg
    st = cfg.stage
    jobs = Path(ledger.url.split(":///", 1)[1]).parent / "jobs" / name  # beside the ledger: the seeds' trackers
    sweep = ledger.create_or_get_sweep(
        name,
        stage=st.name,
        config_yaml=composed.to_yaml(),
        model=cfg.model.name,
        hardware=cfg.hardware.name,
        workload=cfg.workload.name,
        provenance={"bench": "search"},
    )
    policy, env = make_policy(cfg.policy), PlanEnv(cfg.model, cfg.hardware, st, cfg.workload.name)
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
                    line = c.decision.cut  # the early cut, as the driver applies it (sweep/cutoff)
                    cut = line.due(run.times) if line and run.fits else None
                    if line and cut is not None:  # what ran is a screen of its first line.after iterations
                        fid, win = Fidelity.SCREEN, line.window
                        run = dataclasses.replace(run, times=run.times[: line.after])
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
                    max_attempts=cfg.policy.max_attempts,
                    retry_classes=cfg.policy.retry_classes,
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


def fresh_ledger(folder: str | None = None):
    """A new SQLite ledger in a temporary folder (one per policy: the 8k sweep promotes from its 1k sweep)."""
    from orchestrator.ledger.ledger import Ledger

    path = Path(folder or tempfile.mkdtemp(prefix="bench-search-")) / "ledger.sqlite"
    return Ledger.open(f"sqlite:///{path}", create_dir=True)
