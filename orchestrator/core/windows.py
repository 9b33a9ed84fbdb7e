"""The fidelity rungs' arithmetic (issue 12 item 4): the window of each fidelity, the screen's length, the
start-up a launch pays, the early cut's line. One owner, on the bottom floor, because the schedule plans with it,
the driver launches with it and the read model (orchestrator/history: spend, noise) and the report charge and
judge with it (orchestrator/schedule/fidelity.py adds the contenders, a searcher's ranking, and re-exports these):
the schedule (orchestrator/schedule/rungs.py) decides with it, the driver launches the window `decision_window`
reads from a candidate's decision, orchestrator/history sizes the stage's noise and charges each attempt.

Why: every candidate paying the stage's full window (1k: 300 warm-up + 50 measured iterations) spends the
budget on layouts a short window already shows to be slower. A screen ranks many candidates cheaply; the
ones it cannot separate from the best are confirmed at the full window, and only full-window results ever
decide a best (orchestrator.core.ranking: queries.best, history.best_of, the searcher's `best_measured`).

The early cut (`CutLine`) is the same idea inside one launch: a launch at scale whose first iterations are
already clearly slower than the best full-window step stops there (the sweep driver reads its iteration
lines and cancels it, orchestrator/sweep/cutoff.py; the bench cuts its in-process launches with the same
line), and what it ran is kept as a screen of those iterations.

The screen's measured window is sized from measured step-time noise, never guessed: the p50 of n samples
has a standard error of about sqrt(pi/2) * sigma / sqrt(n) (the median of a normal sample), so its 95%
confidence interval is narrower than a relative `resolution` when n >= (1.96 * sqrt(pi/2) * cv / res)^2.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace

from orchestrator.core.decision import CutLine, Decision
from orchestrator.core.schema import StageConfig
from orchestrator.core.states import Fidelity

Z95 = 1.96  # two-sided 95% normal quantile
MEDIAN_SE = math.sqrt(math.pi / 2.0)  # SE(median) / SE(mean) for a normal sample


def pooled_cv(cvs: Iterable[float | None]) -> float | None:
    """One noise figure for the stage: the median of its runs' CVs (None before any run measured it)."""
    xs = [c for c in cvs if c is not None]
    return statistics.median(xs) if xs else None


def half_width(cv: float, n: int) -> float:
    """Relative half-width of the 95% confidence interval of a p50 over n iterations with noise cv."""
    return Z95 * MEDIAN_SE * cv / math.sqrt(max(1, n))


def screen_iters(stage: StageConfig, cv: float | None) -> int:
    """Measured iterations of a screen: the fewest whose p50 CI is narrower than stage.screen.resolution,
    clamped to [screen.min_measure_iters, stage.measure_iters]; the full window before any noise is known."""
    full = stage.measure_iters
    if cv is None or not stage.screen.enabled:
        return full
    n = math.ceil((Z95 * MEDIAN_SE * cv / stage.screen.resolution) ** 2)
    return max(min(stage.screen.min_measure_iters, full), min(full, n))


def window(
    stage: StageConfig,
    fidelity: Fidelity,
    measure_iters: int | None = None,
    *,
    warm: bool = False,
    warmup: int | None = None,
) -> tuple[int, int]:
    """(warm-up, measured iterations) of an attempt at `fidelity`. A screen's measured length comes from
    `screen_iters` (stored in the candidate's decision, so a resumed loop launches the same window). `warm`:
    the launch loads the sweep's seed (stage.warm_start), whose routing has settled, so it warms up only
    stage.warm_start.warmup_iters, or `warmup` where the sweep learned a shorter one (`learned_warmup`), and
    never longer than its fidelity's own warm-up."""
    f = Fidelity(fidelity)
    if f == Fidelity.PROBE:
        return stage.screen.probe_warmup_iters, stage.screen.probe_iters
    if f == Fidelity.FULL:
        w, n = stage.warmup_iters, stage.measure_iters
    else:
        w, n = min(stage.screen.warmup_iters, stage.warmup_iters), int(measure_iters or stage.measure_iters)
    if warm:
        w = min(w, stage.warm_start.warmup_iters, w if warmup is None else warmup)
    return w, n


def learned_warmup(stage: StageConfig, settled: Sequence[int]) -> int | None:
    """The warm-up a warm-started launch needs, from what this sweep's warm launches did (evidence beats
    configuration): warm_start.learn_factor x the most leading iterations any of them ran above its steady
    step (orchestrator.evidence.metrics.settled_iters), at least warm_start.learn_floor and at most
    warm_start.warmup_iters; None (the configured warm-up) before warm_start.learn_after of them measured it.
    A launch whose transient outlasted its warm-up says so (its settled_iters is its warm-up or more), so the
    learned figure only grows with evidence that it was too short."""
    ws = stage.warm_start
    if not ws.learn or len(settled) < ws.learn_after:
        return None
    need = math.ceil(ws.learn_factor * max(settled))
    return max(min(ws.learn_floor, ws.warmup_iters), min(ws.warmup_iters, need))


def decision_window(stage: StageConfig, decision: Decision) -> tuple[Fidelity, tuple[int, int]]:
    """The fidelity and window the next attempt of a candidate runs, from its stored decision (candidates
    added before multi-fidelity rounds, or by other tools, carry none: full; one that does not `warms` cold;
    a warm one's learned warm-up is stored with it, `warmup_iters`)."""
    d = decision
    return d.fidelity, window(stage, d.fidelity, d.measure_iters, warm=d.warms, warmup=d.warmup_iters)


def warm_start_on(stage: StageConfig) -> bool:
    """stage.warm_start applies where it saves something: a stage whose own warm-up is longer than a warm
    start's (1k-16k: 300 against 50; the smoke and slice stages' short warm-ups launch as they are)."""
    return stage.warm_start.enabled and stage.warm_start.warmup_iters < stage.warmup_iters


def startup_s(stage: StageConfig, decision: Decision, *, measured: bool = True) -> float:
    """Seconds a launch of this decision pays beyond its iterations: stage.budget.startup_s, plus reading the
    seed (warm_start.load_s) when it warm-starts, plus writing it (warm_start.save_s) when it saves one and
    got to the save (`measured`: an OOM ends before it)."""
    ws = stage.warm_start
    load = ws.load_s if decision.warms else 0.0
    return stage.budget.startup_s + load + (ws.save_s if decision.seed_save and measured else 0.0)


def use_screen(stage: StageConfig, cv: float | None, *, warm: bool = False) -> bool:
    """Screen new candidates only once noise is measured and a screen is actually shorter than the full window
    (`warm`: both load the sweep's seed, so both warm up only stage.warm_start.warmup_iters)."""
    if cv is None or not stage.screen.enabled:
        return False
    w, n = window(stage, Fidelity.SCREEN, screen_iters(stage, cv), warm=warm)
    return w + n < sum(window(stage, Fidelity.FULL, warm=warm))


def cut_line(
    stage: StageConfig, best_step_s: float | None, decision: Decision, expected_s: float | None = None
) -> CutLine | None:
    """The early cut of a launch of `decision` (its fidelity and window: `decision_window`), against the best
    full-window p50; before any best, the seed's launch against its own `expected_s` x (1 + seed_cut_margin): it
    alone waits out the stage's warm-up, so a seed whose composed step was far too low cost a fresh 1k sweep most of
    its GPU-hours (docs/search-log.md "The seed's own line"). None for a rank probe (it measures compute, and is
    short), for other launches without a best, or where the launch would end by stage.screen.cut_after anyway."""
    sc = stage.screen
    f, (w, n) = decision_window(stage, decision)
    if not sc.cut or f == Fidelity.PROBE or w + n <= sc.cut_after:
        return None
    if best_step_s is not None:
        return CutLine(best_step_s * (1.0 + sc.cut_margin), sc.cut_after, sc.cut_warmup_iters, sc.cut_split)
    if decision.seed_save and expected_s:
        return CutLine(expected_s * (1.0 + sc.seed_cut_margin), sc.cut_after, sc.cut_warmup_iters, sc.cut_split)
    return None


def running_line(stage: StageConfig, decision: Decision, best_step_s: float | None) -> CutLine | None:
    """The line a running launch is held to: its planned one (`decision.cut`), lowered to the best full-window
    p50 the sweep holds now where that is lower. Why: a round's launches of a stage's whole cluster run one after
    another, and a layout measured earlier in the round moves the best; a later launch of the same round held to
    the line of when it was planned ran its whole window 33% over the best already measured (twin:wideband s100 1k
    round 1: 110.6 s against 83.0 s, docs/search-log.md "A running line and the probe's bias"). A launch planned
    without a line keeps none."""
    line, now = decision.cut, cut_line(stage, best_step_s, decision)
    if line is None or now is None or now.step_s >= line.step_s:
        return line
    return replace(line, step_s=now.step_s)
