"""`sweep +stage=1k cluster=local` on an external stand-in passed as workload.command (tests/workloads/cliffs.py),
end to end through the CLI and the local executor; the reported best and GPU-hours are read back and judged against
the stand-in's true surface with the search benchmark's cost model; the benchmark's in-process sweep launches
exactly what the CLI's sweep launched. plateau.py, never tuned on, is judged at 1k and then 8k in that sweep.

The goal is asserted (conf/stage/1k.yaml and the schema's PolicyConfig defaults are tuned for it on the bench's
tune set; plateau.py is its unseen check, issue 19): the reported best within 2% of the true best, at <= 1/3 of
random search's median cost to 2% and <= 10% of the exhaustive grid; the figures are printed too (pytest -s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from orchestrator import history
from orchestrator.config import compose
from orchestrator.core.cost import rank_probe_gpu_hours
from orchestrator.ledger.ledger import Ledger
from orchestrator.plan.layout import Layout
from orchestrator.schedule import fidelity
from tests.bench import searchlib as lib
from tests.sweeplib import cli, ledger_url, sweep_args

STARTUP_S = 300.0
# no early cut: the real driver cuts a job only if it reads it while it runs (a stand-in's are done in a blink),
# the in-process sweep always, so their costs would differ by timing (tests/sweep/test_cutoff.py)
UNCUT = "stage.screen.cut=false"


@dataclass
class Judged:
    """One CLI sweep judged on its stand-in's own truth, with the benchmark's cost model."""

    gap: float  # the reported best's true step over the true best's
    cost: float  # GPU-hours of every launch, at its true step
    random_median: float  # random search's median GPU-hours to within 2%
    exhaustive: float  # GPU-hours of running every legal layout
    launched: list  # every launch: (candidate, attempt) through the CLI, SweepRun.launches in process

    @classmethod
    def on(cls, grid, true_s: float, cost: float, launched: list) -> Judged:
        """A sweep that reported a layout of true step `true_s` for `cost` GPU-hours, judged on `grid` (the target's
        truth) against random search's median cost to 2% over 500 orders."""
        rnd = lib.random_search(grid, orders=500, seed=0)
        return cls(grid.gap(true_s), cost, float(np.median(rnd.cost_to_goal)), grid.exhaustive_gpu_hours, launched)

    @property
    def met(self) -> bool:
        return self.gap <= lib.GOAL_GAP and self.cost <= self.random_median / 3 and self.cost <= 0.10 * self.exhaustive

    def line(self, what: str, via: str = "via the CLI") -> str:
        return (
            f"\n{what} {via}: {len(self.launched)} launches, gap {self.gap:.1%}; cost {self.cost:,.0f} GPU-h "
            f"with {STARTUP_S:.0f} s start-up = {self.cost / self.random_median:.2f} x random's median to 2% "
            f"({self.random_median:,.0f}), {self.cost / self.exhaustive:.1%} of the exhaustive grid "
            f"({self.exhaustive:,.0f})"
        )


def judged_cli_sweep(tmp_path: Path, target: lib.Target, name: str, stage: str, extra: list[str], inproc) -> Judged:
    """`sweep +stage=<stage>` on `target` through the CLI (an 8k stage promotes from the ledger's 1k sweep), its
    reported best judged on the target's truth; the benchmark's in-process sweep, run into `inproc` (a ledger
    kept across stages, as the CLI's is), launches exactly what the CLI's launched, at the same cost."""
    args = sweep_args(tmp_path, name, *target.overrides(), *extra, stage=stage)
    proc = cli("sweep", *args, "--plain", timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    got = cli("best", "--sweep", name, "--json", f"ledger.url={ledger_url(tmp_path)}")
    assert got.returncode == 0, got.stderr[-2000:]
    best = json.loads(got.stdout)
    composed = compose([f"+stage={stage}", "cluster=local", *target.overrides(), *extra])
    cfg = composed.cfg
    with Ledger.open(ledger_url(tmp_path)) as led:
        cands = led.candidates(name)
        launched = [(c, a) for c in cands for a in led.attempts(c.id)]
        spent = history.spent(led, name, stage=cfg.stage)
        job = led.attempts(led.candidate_by_key(name, best["key"]).id)[-1].job_dir
    out = "".join(p.read_text() for p in Path(job).glob("rank-*.out"))
    assert f"(tests/workloads/{target.label}.py)" in out  # the stand-in's banner: it ran, not the twin
    reported = Layout.from_dict(best["layout"])
    row = next(c for c in cands if c.key == best["key"])
    truth = target.launch(cfg, reported, row.layer_pattern, row.key)
    assert truth.fits and best["metrics"]["step_p50_s"] == pytest.approx(truth.step_s, rel=0.02)
    grid = lib.build_grid(cfg, target, STARTUP_S)

    def window(c, a):  # the window each attempt ran: a screen's or probe's (its first decision), else the full one
        d = c.decision if c.decision.fidelity == a.fidelity else c.decision.previous or c.decision
        warmup = d.warmup_iters  # a warm launch's learned warm-up (schedule/fidelity.learned_warmup)
        return fidelity.window(cfg.stage, a.fidelity, d.measure_iters, warm=bool(d.warm_from), warmup=warmup)

    def charged(c, a) -> float:  # a full-scale launch on N GPUs; a rank probe 1 GPU per probed rank
        lay, win, probed = c.layout, window(c, a), c.decision.probed_ranks()
        if a.fidelity == "probe" and probed:
            run = target.probe(cfg, lay, c.layer_pattern, c.key, probed, window=win)
            return rank_probe_gpu_hours(len(probed), STARTUP_S, run.step_s, sum(win) if run.fits else 1)
        run = target.launch(cfg, lay, c.layer_pattern, c.key, window=win)
        seed_s = fidelity.startup_s(cfg.stage, c.decision, measured=run.fits) - cfg.stage.budget.startup_s
        return lib.launch_gpu_hours(cfg.stage.gpus, STARTUP_S + seed_s, sum(win), run)

    cost = sum(charged(c, a) for c, a in launched)
    result = lib.run_sweep(inproc, composed, target, name, STARTUP_S)
    assert sorted((x[0], x[1].short()) for x in result.launches) == sorted(
        (c.round, c.layout.short()) for c, _ in launched
    )
    assert result.gpu_hours == pytest.approx(cost)
    assert 0 < cost <= grid.exhaustive_gpu_hours and spent.gpu_hours > 0
    return Judged.on(grid, truth.step_s, cost, launched)


@pytest.mark.long
def test_sweep_1k_on_an_external_stand_in_reports_a_best_and_its_cost(tmp_path):
    target = lib.Target("ext:cliffs")
    # the learned warm-up (on by default, docs/search.md), named here: the CLI path of learning it is what is checked
    learn = "stage.warm_start.learn=true"
    with lib.fresh_ledger(str(tmp_path / "inproc")) as inproc:
        judged = judged_cli_sweep(tmp_path, target, "cliffs1k", "1k", [UNCUT, learn], inproc)
    # the warm-up learned from evidence (schedule/fidelity.learned_warmup): the stand-in's steps settle at once,
    # so once two warm launches said so the later ones warm up the floor, and each result ran what it was told
    ws = compose(["+stage=1k", "cluster=local", learn]).cfg.stage.warm_start
    learned = [(c, a) for c, a in judged.launched if c.decision.warmup_iters is not None]
    assert ws.learn_floor < ws.warmup_iters
    assert learned and {c.decision.warmup_iters for c, _ in learned} == {ws.learn_floor}
    with Ledger.open(ledger_url(tmp_path)) as led:
        ran = [led.evidence.result(a.id) for c, a in learned if a.fidelity == "full"]
    assert ran and all(r is not None and r["warmup_iters"] == ws.learn_floor for r in ran)
    print(judged.line("cliffs @1k"))
    assert judged.met  # the goal (printed first, so a miss shows its figures)


@pytest.mark.long
def test_an_unseen_stand_in_meets_the_goal_at_1k_then_8k(tmp_path):
    """Issue 19: tests/workloads/plateau.py, written after the defaults were tuned and never tuned on, swept at 1k and
    then at 8k (promoted from the 1k sweep in the same ledger) on the defaults; each stage's reported best within 2%
    of its true best, at <= 1/3 of random search's median cost and <= 10% of the grid. In process (the benchmark's
    sweep, `sweep/simulate.run_sweep`): the CLI's sweep on a stand-in is this sweep, launch for launch (the cliffs
    test above), and the CLI's promotion from 1k to 8k runs in the README tour (tests/house/test_readme_tour.py);
    through the CLI this test cost two thirds of its CPU in job processes that judge nothing more."""
    target = lib.Target("ext:plateau")
    with lib.fresh_ledger(str(tmp_path)) as led:
        for stage in ("1k", "8k"):
            composed = compose([f"+stage={stage}", "cluster=local", *target.overrides()])
            run = lib.run_sweep(led, composed, target, f"plateau{stage}", STARTUP_S)
            grid = lib.build_grid(composed.cfg, target, STARTUP_S)
            judged = Judged.on(grid, run.reported_true_s, run.gpu_hours, run.launches)
            print(judged.line(f"plateau @{stage}", via="in process"))
            assert judged.met, stage


@pytest.mark.long
def test_the_in_process_sweep_is_the_cli_sweep_on_the_twin(tmp_path):
    """The benchmark's substitution, checked on the twin: `sweep +stage=smoke cluster=local` (real twin jobs,
    their logs collected) and the in-process sweep (the truth evaluated, the same seeded step draws) launch
    the same layouts in the same rounds and report the same best."""
    target = lib.Target("twin:memory", seed=2)
    overrides = [*target.overrides(), "stage.budget.max_runs=8"]
    proc = cli("sweep", *sweep_args(tmp_path, "twinsmoke", *overrides), "--plain", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        real = sorted((c.round, c.key, c.status) for c in led.candidates("twinsmoke"))
        real_best = history.best_of(led, "twinsmoke")
    composed = compose(["+stage=smoke", "cluster=local", *overrides])
    with lib.fresh_ledger(str(tmp_path / "inproc")) as led:
        lib.run_sweep(led, composed, target, "twinsmoke", STARTUP_S)
        inproc = sorted((c.round, c.key, c.status) for c in led.candidates("twinsmoke"))
        inproc_best = history.best_of(led, "twinsmoke")
    assert len(real) > 1 and inproc == real
    assert inproc_best["key"] == real_best["key"]
    assert inproc_best["step_p50_s"] == pytest.approx(real_best["step_p50_s"], abs=1e-4)  # logs print 0.1 ms
