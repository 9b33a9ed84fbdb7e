"""`make bench`: search efficiency. Does the sweep find the true best layout, and at what cost?

For every target surface (the twin's named surfaces and the external stand-ins in tests/workloads/) at
every stage (1k, 8k), print:
  - the true best: the fastest layout that fits, and its step (the target's own truth, read in-process);
  - the exhaustive grid's GPU-hours: every legal layout (Megatron's rules) launched once for the stage's
    window (warm-up + measured iterations), start-up included, those that do not fit charged as OOMs;
  - random search: median GPU-hours until its reported best (best measured p50 so far) is within 2% of the
    true best, over --orders random orders of the grid;
  - per policy (the configured default and predicted_topk, or --policy ...): the sweep's GPU-hours to
    within 2%, its total GPU-hours, its final reported gap, and random search's median gap at that budget;
  - met / MISSED: reported best within 2%, total cost <= 1/3 of random's median cost to 2% and <= 10% of
    the exhaustive grid (each miss named).

Substitution (tests/bench/searchlib.py): the sweep is the real decision loop, orchestrator/sweep/decide.py's
next_round and the policy, on a real SQLite ledger; only job execution is replaced by an in-process
evaluation of the target, whose result is recorded through the same Ledger calls as a collected job's. The
8k sweep promotes from the same policy's 1k sweep in its ledger, as `sweep +stage=8k` does (its cost is the
8k sweep's own). Everything is seeded: the same arguments print the same figures.

Cost, the same for every method: orchestrator.core.cost at the true step, N x (start-up + iterations x step), each
launch its own window (a screen's short one, a confirmation's full one; the split per fidelity is printed);
an OOM runs start-up and one iteration. Start-up defaults to 300 s: at 1k-8k GPUs, process launch on every
node, NCCL communicator set-up, model build and the distributed optimizer's allocation, and the first
step's compilation take minutes (--startup-s to change it).

Tune vs held-out: the rows above are the tune set (the surfaces and seeds the defaults were tuned on). The
held-out set (HELDOUT: the twin's `mixed` generator, every effect drawn wide, and `overpredicted`, memory ~2x
over-predicted with EP128 winning, on seeds no tuning used, one on a GPU smaller than its hardware group; and
the ridge and plateau stand-ins, tests/workloads/; issue 48's failure modes: the twin's `overcharged`, `sibling`
and `wideband` surfaces and the sibling stand-in; six fresh seeds of mixed, wideband, overcharged and
overpredicted) runs the default policy after them, and the last table prints
both sets' figures side by side, per stage:
rows meeting the goal, gaps, mean GPU-hours and hours to a decision (full-scale jobs one after another on the
stage's cluster, orchestrator.core.cost.decision_hours). Keep a change only when the held-out figures do not
get worse. Per stage and set, the worst row is printed beside the mean (widest gap, dearest decision, with surface
and seed). --no-heldout / --heldout-only run one set; --heldout-target narrows the held-out set to some surfaces or
rows (twin:sibling, twin:sibling/s101+gpu128); --heldout-orders sizes its random search.

Plug in a policy: --policy NAME (repeatable) and Hydra overrides with --set key=value (e.g. --set
policy.schedule.round_size=6 --set stage.budget.max_runs=40), applied to every sweep. --seed S (repeatable) runs
every twin surface under each seed (tune on several, not on one); --target / --stage narrow the run.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
TARGETS = (
    "twin:balanced",
    "twin:gemm",
    "twin:span",
    "twin:memory",
    "twin:imbalance",
    "twin:tails",
    "ext:surface",
    "ext:cliffs",
)
# Held out: surfaces the defaults were never tuned on (orchestrator/job/twin/truth/surfaces.py `mixed`, every
# effect drawn wide; `overpredicted`, memory ~2x over-predicted and EP128 winning), on seeds no tuning used, one
# of them on a GPU smaller than its hardware group. A change is kept only when these figures do not get worse.
# Seeds 112-115 joined on 2026-12-03: five surfaces had let a policy that met 10/10 here meet 12/16 on eight
# fresh ones (docs/search-log.md "Fresh seeds"); 104-111 are not here, the fit-probe change was tuned on them.
HELDOUT = (
    ("twin:mixed", 100, ()),
    ("twin:mixed", 101, ()),
    ("twin:mixed", 102, ()),
    ("twin:mixed", 103, ("workload.twin.gpu_capacity_gb=120",)),
    ("twin:overpredicted", 100, ()),
    *((surface, seed, ()) for surface in ("twin:mixed", "twin:overpredicted") for seed in (112, 113, 114, 115)),
    # workload.command stand-ins written after the defaults were tuned (docs/search-log.md, "An unseen stand-in")
    ("ext:ridge", 0, ()),
    ("ext:plateau", 0, ()),
    # issue 48's failure modes (orchestrator/job/twin/truth/surfaces.py): light recompute's memory over-charged
    # 5-10x, the optimum one recompute module from a 2-5% slower sibling, per-tensor memory errors no per-term
    # fit holds. Joined on 2026-12-06 with the policy of the day unchanged (docs/search-log.md "Worst rows").
    *((surface, seed, ()) for surface in ("twin:overcharged", "twin:sibling", "twin:wideband") for seed in (100, 101)),
    # the case: the optimum (no recompute) 0.7 GB under the GPU, its moe_act sibling 1.8 GB under, 3.8% slower
    ("twin:sibling", 101, ("workload.twin.gpu_capacity_gb=128",)),
    # the same on a stand-in (tests/workloads/sibling.py): the planner prices the optimum at 282 GB, it runs at 131
    ("ext:sibling", 0, ()),
    # Fresh seeds no change was tuned on, joined on 2026-12-07 with the policy of the day (neighbour_hold): the set
    # above met 46/46 where seeds 120-131 met 91/96 (docs/search-log.md "A planned neighbour holds convergence")
    *(
        (surface, seed, ())
        for surface in ("twin:mixed", "twin:wideband", "twin:overcharged", "twin:overpredicted")
        for seed in range(132, 138)
    ),
)
HELDOUT_ORDERS = 100
MEAN_GPU_H_GOAL = {"1k": 25_000.0}  # mean GPU-hours of a stage's decision, per set (issue 19)
STAGES = ("1k", "8k")
POLICIES = ("calibrated_neighbours", "predicted_topk")
STARTUP_S = 300.0
ORDERS = 1000
RANDOM_FRACTION, GRID_FRACTION = 1 / 3, 0.10


@dataclass
class Row:
    """One (target, stage, policy) line of the table."""

    target: str
    stage: str
    policy: str
    best: str
    best_s: float
    grid_gpu_h: float
    random_to_goal: float  # median GPU-hours
    sweep_to_goal: float
    sweep_gpu_h: float
    launches: int
    gap: float
    random_gap_at_budget: float  # median
    reason: str
    decision_h: float = math.nan  # hours to the decision on a cluster of the stage's size
    seed: int = 0  # the twin's seed (a stand-in has one surface: 0)
    # the whole sweep's simulated price (orchestrator/sweep/price.py; --price): its 90% range and mean
    price_lo: float = math.nan
    price_hi: float = math.nan
    price_mean: float = math.nan

    @property
    def in_range(self) -> bool | None:
        """The actual total inside the price's 90% range (None: not priced)."""
        if math.isnan(self.price_lo):
            return None
        return self.price_lo <= self.sweep_gpu_h <= self.price_hi

    @property
    def label(self) -> str:
        """The row's surface and seed, as the worst-row lines name it."""
        return self.target if "/s" in self.target else f"{self.target}/s{self.seed}"

    @property
    def misses(self) -> list[str]:
        out = []
        if not self.gap <= 0.02:
            out.append(f"gap {_pct(self.gap)} > 2%")
        if not self.sweep_gpu_h <= RANDOM_FRACTION * self.random_to_goal:
            out.append(f"cost {self.sweep_gpu_h / self.random_to_goal:.2f} x random's > 1/3")
        if not self.sweep_gpu_h <= GRID_FRACTION * self.grid_gpu_h:
            out.append(f"cost {self.sweep_gpu_h / self.grid_gpu_h:.1%} of grid > 10%")
        return out


def _pct(x: float) -> str:
    return "never" if not np.isfinite(x) else f"{x:.1%}"


def _gh(x: float) -> str:
    return "never" if not np.isfinite(x) else f"{x / 1000:,.1f}k"


def _priced(composed) -> str:
    """A config as the price reads it: the twin's hidden truth (workload.twin) is no input of the price."""
    import yaml

    d = yaml.safe_load(composed.to_yaml())
    d.get("workload", {}).pop("twin", None)
    return yaml.safe_dump(d, sort_keys=True)


def run(
    targets=TARGETS,
    stages=STAGES,
    policies=POLICIES,
    overrides=(),
    startup_s=STARTUP_S,
    orders=ORDERS,
    seeds=(0,),
    verbose=False,
    out=sys.stdout,
    specs=None,
    price_samples=0,
) -> list[Row]:
    """Every (target, stage, policy) row, printed as it is measured. Twin targets run once per seed; `specs`
    ((name, seed, extra overrides), e.g. HELDOUT) replaces targets x seeds. `price_samples` > 0: each row's
    whole-sweep price (orchestrator/sweep/price.py, that many sampled surfaces) and whether the actual lies in it."""
    from orchestrator.config import compose
    from tests.bench import searchlib as lib

    rows: list[Row] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-search-"))
    if specs is None:
        specs = [(t, s, ()) for t in targets for s in (seeds if t.startswith("twin:") else (0,))]
        label_seed = len(seeds) > 1
    else:
        label_seed = True
    composed_at: dict[tuple[str, str], object] = {}  # (stage, policy) -> this target's composed config
    prices: dict[tuple[str, str, int], object] = {}  # the price reads only the config: one per config, seeded
    for name, seed, extra in specs:
        target = lib.Target(name, seed=seed, extra=tuple(extra))
        name = spec_label(name, seed, extra, label_seed)
        ledgers = {p: lib.fresh_ledger(str(_mk(tmp / name.replace(":", "-").replace("/", "-") / p))) for p in policies}
        for stage in stages:
            grid = rnd = None
            for policy in policies:
                extra = [] if _source_ran(stage, stages) else ["stage.promotes_from=null"]
                composed = compose(
                    [f"+stage={stage}", "cluster=local", f"policy.name={policy}", *target.overrides(), *extra]
                    + [f"stage.budget.startup_s={startup_s}"]  # the sweep's own budget charges start-up alike
                    + list(overrides)
                )
                cfg = composed.cfg
                composed_at[stage, policy] = composed
                if grid is None:
                    grid = lib.build_grid(cfg, target, startup_s)
                    rnd = lib.random_search(grid, orders, seed)
                    best = grid.layouts[grid.best]
                    print(
                        f"{name} @{stage}: true best {best.short()} {grid.best_s:.3f} s "
                        f"({len(grid.layouts):,} legal, {int(np.isfinite(grid.true_s).sum()):,} fit); "
                        f"exhaustive {_gh(grid.exhaustive_gpu_hours)} GPU-h; random to 2%: median "
                        f"{_gh(float(np.median(rnd.cost_to_goal)))} GPU-h over {orders} orders"
                        + ("" if not extra else " [8k standalone: no 1k sweep to promote from]"),
                        file=out,
                        flush=True,
                    )
                sw = lib.run_sweep(ledgers[policy], composed, target, f"{stage}-{policy}", startup_s)
                row = Row(
                    target=name,
                    stage=stage,
                    policy=policy,
                    best=grid.layouts[grid.best].short(),
                    best_s=grid.best_s,
                    grid_gpu_h=grid.exhaustive_gpu_hours,
                    random_to_goal=float(np.median(rnd.cost_to_goal)),
                    sweep_to_goal=sw.cost_to_goal(grid),
                    sweep_gpu_h=sw.gpu_hours,
                    launches=len(sw.launches),
                    gap=grid.gap(sw.reported_true_s),
                    random_gap_at_budget=float(np.median(rnd.gap_at(sw.gpu_hours))),
                    reason=sw.reason,
                    decision_h=sw.decision_hours(cfg.stage.gpus, cfg.cluster.probe_gpus),
                    seed=seed,
                )
                if price_samples:
                    from orchestrator.sweep.price import price

                    src = composed_at.get((cfg.stage.promotes_from or "", policy)) if not extra else None
                    key = (_priced(composed), _priced(src) if src is not None else "", price_samples)
                    if key not in prices:
                        prices[key] = price(
                            cfg,
                            composed.to_yaml(),
                            [(src.cfg, src.to_yaml())] if src is not None else [],
                            samples=price_samples,
                        )
                    pr = prices[key]
                    row.price_lo, row.price_hi, row.price_mean = pr.lo, pr.hi, pr.gpu_hours
                    print(
                        f"   price: {pr.line()} [samples {', '.join(_gh(s) for s in pr.samples)}]; "
                        f"actual {_gh(row.sweep_gpu_h)}: " + ("in range" if row.in_range else "OUT of range"),
                        file=out,
                        flush=True,
                    )
                rows.append(row)
                split = ", ".join(f"{k} {_gh(v)}" for k, v in sorted(sw.gpu_hours_by().items()))
                print(
                    f"   {policy}: {row.launches} launches, {_gh(row.sweep_gpu_h)} GPU-h [{split}], "
                    f"{row.decision_h:.0f} h on {cfg.stage.gpus} GPUs (to 2%: "
                    f"{_gh(row.sweep_to_goal)}), reported {sw.reported.short() if sw.reported else '-'} gap "
                    f"{_pct(row.gap)}; random at that budget: median gap {_pct(row.random_gap_at_budget)}; "
                    f"stop: {row.reason}; " + ("met" if not row.misses else "MISSED: " + "; ".join(row.misses)),
                    file=out,
                    flush=True,
                )
                if verbose:
                    for line in sw.events:
                        print(f"      {line}", file=out)
        for led in ledgers.values():
            led.close()
    return rows


def spec_label(name: str, seed: int, extra=(), with_seed: bool = True) -> str:
    """How a row names its target: twin:sibling/s101+gpu128 (the seed, and a GPU smaller than its group)."""
    if name.startswith("twin:") and with_seed:
        name = f"{name}/s{seed}"
    if extra:
        name += "+" + ",".join(x.rsplit(".", 1)[-1].replace("gpu_capacity_gb=", "gpu") for x in extra)
    return name


def _mk(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _source_ran(stage: str, stages) -> bool:
    """An 8k sweep promotes from this run's 1k sweep when 1k ran first; else it runs standalone."""
    from orchestrator.config import compose

    src = compose([f"+stage={stage}"]).cfg.stage.promotes_from
    return not src or (src in stages and list(stages).index(src) < list(stages).index(stage))


def _in(r: Row) -> str:
    """The "in range" column: the actual total inside the whole-sweep price's 90% range ("-": not priced)."""
    return "-" if r.in_range is None else "yes" if r.in_range else "NO"


def figures(rows: list[Row]) -> dict[str, str]:
    """One set's figures (tune or held-out), as the side-by-side table prints them."""
    out: dict[str, str] = {"rows met": f"{sum(not r.misses for r in rows)}/{len(rows)}"}
    for st in STAGES:
        rs = [r for r in rows if r.stage == st]
        if not rs:
            continue
        gaps = [r.gap for r in rs]
        out[f"{st} met"] = f"{sum(not r.misses for r in rs)}/{len(rs)}"
        out[f"{st} within 2%"] = f"{sum(g <= 0.02 for g in gaps)}/{len(rs)}"
        out[f"{st} mean gap"] = _pct(float(np.mean(gaps)))
        out[f"{st} worst gap"] = _pct(float(np.max(gaps)))
        mean = float(np.mean([r.sweep_gpu_h for r in rs]))
        out[f"{st} mean GPU-h"] = _gh(mean)
        if st in MEAN_GPU_H_GOAL:  # issue 19: a 1k decision in one day of the 1,024-GPU cluster
            goal = MEAN_GPU_H_GOAL[st]
            out[f"{st} mean <= {_gh(goal)}"] = "met" if mean <= goal else "MISSED"
        out[f"{st} mean hours to decide"] = f"{np.mean([r.decision_h for r in rs]):.0f} h"
        priced = [r for r in rs if r.in_range is not None]
        if priced:
            out[f"{st} in range"] = f"{sum(bool(r.in_range) for r in priced)}/{len(priced)}"
        out[f"{st} mean cost / random's"] = f"{np.mean([r.sweep_gpu_h / r.random_to_goal for r in rs]):.2f}"
    return out


def worst(rows: list[Row]) -> list[str]:
    """Per stage, the worst row beside the mean: the widest gap to the true best and the dearest decision, each
    with its surface and seed (a mean hides the rows a cluster would wait days on)."""
    out = []
    for st in STAGES:
        rs = [r for r in rows if r.stage == st]
        if not rs:
            continue
        g = max(rs, key=lambda r: r.gap)
        c = max(rs, key=lambda r: r.sweep_gpu_h)
        out.append(
            f"{st}: mean gap {_pct(float(np.mean([r.gap for r in rs])))}, worst {_pct(g.gap)} on {g.label} "
            f"({_gh(g.sweep_gpu_h)} GPU-h); mean GPU-h {_gh(float(np.mean([r.sweep_gpu_h for r in rs])))}, worst "
            f"{_gh(c.sweep_gpu_h)} on {c.label} (gap {_pct(c.gap)}, {c.decision_h:.0f} h to decide)"
        )
    return out


# The last run's worst-row lines, per set: run_all.py prints them at the end of `make bench`.
WORST: dict[str, list[str]] = {}


def side_by_side(tune: list[Row], held: list[Row], policy: str, out=sys.stdout) -> None:
    """The tune set's and the held-out set's figures for `policy`, one line per figure."""
    a = figures([r for r in tune if r.policy == policy])
    b = figures([r for r in held if r.policy == policy])
    print(f"\n{policy}: tune vs held-out", file=out)
    print(f"{'figure':<26}{'tune':>12}{'held-out':>12}", file=out)
    for k in dict.fromkeys([*a, *b]):
        print(f"{k:<26}{a.get(k, '-'):>12}{b.get(k, '-'):>12}", file=out)
    WORST.clear()
    for name, rows in (("tune", tune), ("held-out", held)):
        lines = worst([r for r in rows if r.policy == policy])
        if lines:
            WORST[name] = lines
            print(f"worst rows, {name} ({policy}):", file=out)
            for line in lines:
                print(f"  {line}", file=out)


def summary(rows: list[Row], out=sys.stdout) -> bool:
    print(
        f"\n{'target':<26}{'stage':<6}{'policy':<23}{'true best s':>12}{'grid GPU-h':>12}{'rnd->2%':>10}"
        f"{'sweep->2%':>11}{'sweep':>9}{'gap':>7}{'rnd gap@B':>10}{'in range':>10}  goal",
        file=out,
    )
    for r in rows:
        print(
            f"{r.target:<26}{r.stage:<6}{r.policy:<23}{r.best_s:>12.3f}{_gh(r.grid_gpu_h):>12}"
            f"{_gh(r.random_to_goal):>10}{_gh(r.sweep_to_goal):>11}{_gh(r.sweep_gpu_h):>9}{_pct(r.gap):>7}"
            f"{_pct(r.random_gap_at_budget):>10}{_in(r):>10}  " + ("met" if not r.misses else "MISSED"),
            file=out,
        )
    met = sum(not r.misses for r in rows)
    print(f"goal met on {met}/{len(rows)} (target, stage, policy) rows", file=out)
    return met == len(rows)


def main(argv=None) -> bool:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", action="append", help=f"repeatable; default: {', '.join(TARGETS)}")
    p.add_argument("--stage", action="append", help="repeatable; default: 1k, 8k")
    p.add_argument("--policy", action="append", help=f"repeatable; default: {', '.join(POLICIES)}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Hydra override for every sweep")
    p.add_argument("--startup-s", type=float, default=STARTUP_S)
    p.add_argument("--orders", type=int, default=ORDERS, help="random-search orders")
    p.add_argument("--seed", type=int, action="append", help="repeatable: twin.seed (and the random orders' seed)")
    p.add_argument("--verbose", action="store_true", help="print each sweep's rounds")
    p.add_argument("--heldout-orders", type=int, default=HELDOUT_ORDERS, help="random-search orders, held-out set")
    p.add_argument(
        "--price",
        type=int,
        default=0,
        metavar="SAMPLES",
        help="price each row's whole sweep (orchestrator/sweep/price.py, SAMPLES surfaces) and report 'in range'",
    )
    p.add_argument("--no-heldout", action="store_true", help="the tune set only")
    p.add_argument("--heldout-only", action="store_true", help="the held-out set only")
    p.add_argument(
        "--heldout-target",
        action="append",
        help="repeatable: only these held-out surfaces or rows (twin:sibling, twin:sibling/s101+gpu128)",
    )
    a = p.parse_args(argv or [])
    labels = {x: {x[0], spec_label(*x)} for x in HELDOUT}
    unknown = sorted(set(a.heldout_target or ()) - set().union(*labels.values()))
    if unknown:
        known = ", ".join(dict.fromkeys(x[0] for x in HELDOUT))
        p.error(f"--heldout-target {', '.join(unknown)}: not held out; pick from {known}")
    t0 = time.perf_counter()
    policies = a.policy or POLICIES
    rows: list[Row] = []
    if not a.heldout_only:
        print("== tune set", flush=True)
        rows = run(
            targets=a.target or TARGETS,
            stages=a.stage or STAGES,
            policies=policies,
            overrides=a.set,
            startup_s=a.startup_s,
            orders=a.orders,
            seeds=a.seed or (0,),
            verbose=a.verbose,
            price_samples=a.price,
        )
    held: list[Row] = []
    if not a.no_heldout:  # the default policy only: held-out rows judge the defaults
        print("== held-out set (never tuned on)", flush=True)
        held = run(
            stages=a.stage or STAGES,
            policies=policies[:1],
            overrides=a.set,
            startup_s=a.startup_s,
            orders=a.heldout_orders,
            verbose=a.verbose,
            specs=[x for x in HELDOUT if not a.heldout_target or labels[x] & set(a.heldout_target)],
            price_samples=a.price,
        )
    ok = summary(rows + held)
    side_by_side(rows, held, policies[0])
    print(f"bench_search: {time.perf_counter() - t0:.0f} s wall, start-up {a.startup_s:.0f} s per launch")
    return ok


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1:]) else 1)
