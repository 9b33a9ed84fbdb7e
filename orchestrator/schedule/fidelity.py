"""The fidelity rungs' arithmetic (issue 12 item 4): the window of each fidelity, the screen's length, the
contenders. The schedule (orchestrator/schedule/rungs.py) decides with it; the driver launches the window
`decision_window` reads from a candidate's decision; observe sizes the stage's noise with it.

Why: every candidate paying the stage's full window (1k: 300 warm-up + 50 measured iterations) spends the
budget on layouts a short window already shows to be slower. A screen ranks many candidates cheaply; the
ones it cannot separate from the best are confirmed at the full window, and only full-window results ever
decide a best (orchestrator.core.ranking: queries.best, observe.best_of, the searcher's `best_measured`).

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from orchestrator.core.schema import StageConfig
from orchestrator.core.states import Fidelity
from orchestrator.search.select import measured_rank
from orchestrator.search.types import Observation

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


def decision_window(stage: StageConfig, decision: dict | None) -> tuple[Fidelity, tuple[int, int]]:
    """The fidelity and window the next attempt of a candidate runs, from its stored decision (candidates
    added before multi-fidelity rounds, or by other tools, carry none: full; one that does not `warms` cold;
    a warm one's learned warm-up is stored with it, `warmup_iters`)."""
    d = decision or {}
    f = Fidelity(d.get("fidelity") or Fidelity.FULL)
    w = d.get("warmup_iters")
    return f, window(stage, f, d.get("measure_iters"), warm=warms(d), warmup=None if w is None else int(w))


def warm_start_on(stage: StageConfig) -> bool:
    """stage.warm_start applies where it saves something: a stage whose own warm-up is longer than a warm
    start's (1k-16k: 300 against 50; the smoke and slice stages' short warm-ups launch as they are)."""
    return stage.warm_start.enabled and stage.warm_start.warmup_iters < stage.warmup_iters


def warms(decision: dict | None) -> bool:
    """The launch loads the sweep's seed: it names it (`warm_from`), or waits for it (`after_seed`: it goes
    only once the seed is there, orchestrator/sweep/seeding.py, and then names it)."""
    d = decision or {}
    return bool(d.get("warm_from") or d.get("after_seed"))


def startup_s(stage: StageConfig, decision: dict | None, *, measured: bool = True) -> float:
    """Seconds a launch of this decision pays beyond its iterations: stage.budget.startup_s, plus reading the
    seed (warm_start.load_s) when it warm-starts, plus writing it (warm_start.save_s) when it saves one and
    got to the save (`measured`: an OOM ends before it)."""
    d, ws = decision or {}, stage.warm_start
    load = ws.load_s if warms(d) else 0.0
    return stage.budget.startup_s + load + (ws.save_s if d.get("seed_save") and measured else 0.0)


def probe_ranks(decision: dict | None) -> list[int]:
    """The ranks a rank probe runs, from its stored decision (orchestrator.plan.ranks.probe_ranks chose them),
    or the decision it was probed under before a confirmation replaced it (`previous`, sweep/decide.py); a
    probe decided before rank probes carries none and runs as it was decided: at full scale on N GPUs."""
    d = decision or {}
    while d:
        if d.get("probe_ranks"):
            return [int(r) for r in d["probe_ranks"]]
        d = d.get("previous") or {}
    return []


def use_screen(stage: StageConfig, cv: float | None, *, warm: bool = False) -> bool:
    """Screen new candidates only once noise is measured and a screen is actually shorter than the full window
    (`warm`: both load the sweep's seed, so both warm up only stage.warm_start.warmup_iters)."""
    if cv is None or not stage.screen.enabled:
        return False
    w, n = window(stage, Fidelity.SCREEN, screen_iters(stage, cv), warm=warm)
    return w + n < sum(window(stage, Fidelity.FULL, warm=warm))


def contenders(rows: Sequence[Observation], cv: float | None, limit: int) -> list[Observation]:
    """Screened layouts not yet confirmed that the screen cannot separate from the best (successive halving
    with the CI as the cut): a screened p50 whose lower 95% bound is at or below the reference, where the
    reference is the best full-window p50 (or the best screened upper bound, if that is lower). Best first."""
    screened = [r for r in rows if r.ok and r.fidelity == Fidelity.SCREEN and r.failure_class is None]
    if not screened or limit <= 0:
        return []
    noise = cv or 0.0

    def lo(r: Observation) -> float:
        return r.measured_step_s * (1.0 - half_width(noise, r.measure_iters or 1))

    def hi(r: Observation) -> float:
        return r.measured_step_s * (1.0 + half_width(noise, r.measure_iters or 1))

    full = [r.measured_step_s for r in rows if r.ok and r.fidelity == Fidelity.FULL]
    ref = min([*full, *(hi(r) for r in screened)])
    return measured_rank([r for r in screened if lo(r) <= ref])[:limit]  # the one ranking, screens included


@dataclass(frozen=True)
class CutLine:
    """The early cut of one launch (stage.screen.cut*), stored in its candidate's decision (`cut`) so a resumed
    driver applies the same line: stop once iterations skip+1..after are run and their median step is above
    `step_s` (the sweep's best full-window p50 x (1 + cut_margin) when the round was planned). What ran is a
    screen of `after - skip` measured iterations after `skip` warm-up ones: it ranks, never decides a best."""

    step_s: float
    after: int
    skip: int

    @property
    def window(self) -> tuple[int, int]:
        """(warm-up, measured iterations) of the result a cut launch leaves."""
        return self.skip, self.after - self.skip

    def due(self, times: Sequence[float]) -> float | None:
        """The median step that cuts the launch, given its per-iteration seconds from iteration 1 on; None while
        fewer than `after` have run or when the median is at or under the line."""
        if len(times) < self.after:
            return None
        med = statistics.median(times[self.skip : self.after])
        return med if med > self.step_s else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, decision: Mapping | None) -> CutLine | None:
        """The line a candidate's decision carries (None: never cut: a decision of before the cut, a probe, or a
        launch planned before the sweep had a full-window best)."""
        d = (decision or {}).get("cut")
        return cls(float(d["step_s"]), int(d["after"]), int(d["skip"])) if d else None


def cut_line(stage: StageConfig, best_step_s: float | None, decision: dict | None) -> CutLine | None:
    """The early cut of a launch of `decision` (its fidelity and window: `decision_window`), against the best
    full-window p50: none for a rank probe (it measures compute, and is short), without a best, or where the
    launch would end by stage.screen.cut_after anyway."""
    sc = stage.screen
    f, (w, n) = decision_window(stage, decision)
    if not sc.cut or best_step_s is None or f == Fidelity.PROBE or w + n <= sc.cut_after:
        return None
    return CutLine(best_step_s * (1.0 + sc.cut_margin), sc.cut_after, sc.cut_warmup_iters)
