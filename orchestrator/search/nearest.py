"""Predicting from the nearest measurement (issue 48 item 1): an unmeasured layout one knob away from a layout
that ran at scale is estimated as that neighbour's measured memory and step plus the calibrated model's delta for
the knob that differs, the delta scaled by what measured pairs differing in the same knob showed.

Why: the absolute model's error is mostly level, shared by neighbours, and the knob's delta is what it gets
wrong only in part. On issue 48's unseen 1k surface the calibrated model called a layout that ran at 128.5 GB
over capacity and charged 25-65 GB for dropping its `moe_act` recompute (4.7 GB in truth), so the optimum one
module away was never proposed nor probed. Where this estimate says a layout fits and the absolute model says it
does not, or predicts its step more than policy.search.converge_gain apart, the layout is `disputed`: only a measurement
settles it (schedule/steps/sibling_probes.py probes it, then measures it at scale, and holds convergence until
then).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from orchestrator.core.failures import Failure
from orchestrator.core.states import Fidelity
from orchestrator.plan.layout import Layout
from orchestrator.search.calibrate import Fit
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import changed_knob, needs_more_memory
from orchestrator.search.types import Observation

DELTA_SCALE = (0.0, 2.0)  # a knob's measured / modelled delta is kept inside this (sanity bounds only)
MIN_MODEL_DELTA = (0.5, 1e-3)  # (GB, s): a pair whose modelled delta is smaller teaches no scale


@dataclass(frozen=True)
class NearestEstimate:
    """An unmeasured layout as its nearest measured neighbour says, beside what the absolute model says."""

    key: str
    layout: Layout
    neighbour: Observation  # the layout that ran at scale, one knob away
    knob: str  # the knob group they differ in (select.changed_knob)
    memory_gb: float  # neighbour's measured peak + the (scaled) modelled delta
    step_s: float  # neighbour's measured step + the (scaled) modelled delta
    # less `explore` x the knob's spread: how far the scaled delta missed the measured pairs of that knob (none: 0)
    optimistic_s: float
    model_memory_gb: float  # the calibrated absolute model's
    model_step_s: float
    fits: bool  # by this estimate (env.fits: + the stage's margin under HBM)
    model_fits: bool
    # it fits by this estimate and the absolute model says it does not, or predicts its step more than the goal
    # apart (where neither says it fits, what it would run at teaches nothing)
    disputed: bool

    def why(self) -> str:
        """One line: the estimate, where it comes from, and the absolute model's view."""
        return (
            f"from {self.neighbour.key[:10]} ({self.knob} differs): {self.memory_gb:.1f} GB, {self.step_s:.4g}s "
            f"(optimistic {self.optimistic_s:.4g}s); "
            f"the absolute model {self.model_memory_gb:.1f} GB, {self.model_step_s:.4g}s"
        )


def at_scale(row: Observation) -> bool:
    """The row ran at scale and carries its own peak and step (a probe's reading is not the layout's)."""
    return row.ok and row.peak_gb is not None and row.fidelity != Fidelity.PROBE and not row.partial


def _scale(pairs: Iterable[tuple[float, float]], floor: float) -> float:
    """Median measured / modelled delta over pairs, 1 with none (the model's delta as it is)."""
    ratios = [m / d for d, m in pairs if abs(d) >= floor]
    if not ratios:
        return 1.0
    return min(max(statistics.median(ratios), DELTA_SCALE[0]), DELTA_SCALE[1])


def estimates(
    env: PlanEnv,
    fit: Fit,
    rows: Sequence[Observation],
    *,
    knobs: Sequence[str],
    step_margin: float,
    explore: float = 1.0,
    skip: Callable[[str], bool] = lambda _k: False,
) -> list[NearestEstimate]:
    """Every legal layout one knob of `knobs` away from a layout that ran at scale, not itself measured at scale
    (nor `skip`ped by key), estimated from its nearest such neighbour (the one the model sees the smallest memory
    delta to), best optimistic step first (the estimate less `explore` x its knob's spread over measured pairs)."""
    ran = [r for r in rows if at_scale(r)]
    if not ran:
        return []
    measured = {r.key for r in ran}
    mem = fit.memory_scale

    def model(layout: Layout) -> tuple[float, float] | None:
        p = env.evaluate_unchecked(layout, fit.factors, mem)
        return (p.prediction.memory_gb, p.prediction.step_time_s) if p is not None else None

    cache: dict[str, tuple[float, float] | None] = {}

    def of(r: Observation) -> tuple[float, float] | None:
        if r.key not in cache:
            cache[r.key] = model(r.layout)
        return cache[r.key]

    # per knob: modelled and measured (memory, step) deltas of the pairs that ran at scale differing only in it,
    # with the pair's first step (what a step delta is relative to)
    pairs: dict[str, list[tuple[tuple[float, float], tuple[float, float], float]]] = {}
    for i, a in enumerate(ran):
        for b in ran[i + 1 :]:
            knob = changed_knob(a.layout, b.layout)
            ma, mb = of(a), of(b)
            if knob is not None and knob in knobs and ma is not None and mb is not None:
                d = (mb[0] - ma[0], mb[1] - ma[1])
                m = (b.measured_peak_gb - a.measured_peak_gb, b.measured_step_s - a.measured_step_s)
                pairs.setdefault(knob, []).append((d, m, a.measured_step_s))
    scale: dict[str, tuple[float, float, float]] = {}  # knob -> (memory delta scale, step delta scale, step spread)
    for k, v in pairs.items():
        k_mem = _scale(((d[0], m[0]) for d, m, _ in v), MIN_MODEL_DELTA[0])
        k_step = _scale(((d[1], m[1]) for d, m, _ in v), MIN_MODEL_DELTA[1])
        # how far the scaled step delta missed its own pairs (RMS, relative to the step): the estimate's spread
        sd = math.sqrt(statistics.fmean(((m[1] - k_step * d[1]) / s) ** 2 for d, m, s in v))
        scale[k] = (k_mem, k_step, sd)
    out: dict[str, NearestEstimate] = {}
    for c in env.legal(fit.factors):
        if c.key in measured or skip(c.key):
            continue
        near = [(knob, r) for r in ran if (knob := changed_knob(r.layout, c.layout)) is not None and knob in knobs]
        if not near:
            continue
        mc = model(c.layout)
        if mc is None:
            continue
        found: list[tuple[float, NearestEstimate]] = []
        for knob, r in near:
            mr = of(r)
            if mr is None:
                continue
            k_mem, k_step, sd = scale.get(knob, (1.0, 1.0, 0.0))
            gb = r.measured_peak_gb + k_mem * (mc[0] - mr[0])
            step = max(1e-9, r.measured_step_s + k_step * (mc[1] - mr[1]))
            off = mc[1] > 0 and abs(step / mc[1] - 1.0) > step_margin
            fits, model_fits = env.fits(gb), env.fits(mc[0])
            e = NearestEstimate(
                key=c.key,
                layout=c.layout,
                neighbour=r,
                knob=knob,
                memory_gb=gb,
                step_s=step,
                optimistic_s=step * max(0.0, 1.0 - explore * sd),
                model_memory_gb=mc[0],
                model_step_s=mc[1],
                fits=fits,
                model_fits=model_fits,
                disputed=fits and (not model_fits or off),
            )
            found.append((abs(mc[0] - mr[0]), e))
        if found:  # the nearest: the smallest modelled memory delta, the one the model can miss least
            out[c.key] = min(found, key=lambda t: t[0])[1]
    return sorted(out.values(), key=lambda e: e.optimistic_s)


def settled(layout: Layout, key: str, rows: Iterable[Observation]) -> bool:
    """A measurement has spoken for this layout: it ran at scale, failed (an OOM or any other class), or needs at
    least as much memory as a layout that OOMed (select.needs_more_memory)."""
    for r in rows:
        if r.key == key and (at_scale(r) or r.failure_class is not None):
            return True
        if r.failure_class == Failure.OOM and needs_more_memory(layout, r.layout):
            return True
    return False
