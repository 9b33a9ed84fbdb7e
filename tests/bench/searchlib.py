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
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from orchestrator.core.decision import Decision
from orchestrator.sweep import simulate
from orchestrator.sweep.simulate import (  # noqa: F401 - the bench's names for the product's simulation
    HOLDER,
    Launch,
    SweepRun,
    launch_gpu_hours,
    p50_of_window,
    probe_refusal,
    settled_of,
)

ROOT = Path(__file__).resolve().parent.parent.parent
WORKLOADS = ROOT / "tests" / "workloads"
GOAL_GAP = 0.02  # reported best within 2% of the true best


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
def run_sweep(ledger, composed, target: Target, name: str, startup_s: float) -> SweepRun:
    """Drive one sweep to its end on `target` (orchestrator/sweep/simulate.run_sweep, the composed config)."""
    return simulate.run_sweep(ledger, composed.cfg, composed.to_yaml(), target, name, startup_s)


def fresh_ledger(folder: str | None = None):
    """A new SQLite ledger in a temporary folder (one per policy: the 8k sweep promotes from its 1k sweep)."""
    from orchestrator.ledger.ledger import Ledger

    path = Path(folder or tempfile.mkdtemp(prefix="bench-search-")) / "ledger.sqlite"
    return Ledger.open(f"sqlite:///{path}", create_dir=True)
