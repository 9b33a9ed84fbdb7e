"""Calibrate the planner's step-time and memory models on measurements from the ledger.

Step time: measured ~= sum_c f_c x component_c (the planner's components, uncalibrated). A row that carries a
rank probe's compute-only step as well has its compute and optimizer measured (compose.py: the composed step)
and only the rest fitted, on the run's residual (measured full step - the probe-measured part); the sweep
hands over none such (a layout that ran at scale is fitted on its whole step: orchestrator/sweep/history.py
says why). The factors
f_c >= 0 are fitted by non-negative least squares on *relative* residuals (layouts differ by several x
in step time; a 10% miss matters equally on each), regularized toward 1 so a component the
measurements cannot separate keeps its analytic value. With few rows, or when leave-one-out says the
per-component fit generalizes worse, a single ratio (median measured / predicted) is used instead.

Memory: per term (model states, activations, buffers) from the measured peak of every PP stage, OOMs as
lower bounds (memfit.py). With few layouts, a single ratio: median(measured heaviest-rank peak /
predicted), raised so every layout that OOMed would be predicted over capacity (its neighbours get pruned),
but never so far that a layout that ran would be predicted infeasible. `memory_estimate` gives a layout's
calibrated peak and its leave-one-out band; `within_band` says HBM lies inside it (neither surely fits nor
surely OOMs: a cheap fit probe decides, not the model).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from orchestrator.core.failures import Failure
from orchestrator.plan.memory import TERMS
from orchestrator.search import compose, memfit
from orchestrator.search.nnls import toward_one
from orchestrator.search.types import Observation

REG = 0.01  # pull toward 1 per component, in units of squared relative error
MIN_ROWS_COMPONENTS = 4  # fewer rows: a single ratio (LOO on 3 points cannot tell the two apart)
MEMORY_CLAMP = (0.1, 100.0)  # sanity bounds only: the data decides


@dataclass
class Fit:
    """One round's calibration: what was fitted, on how much evidence, and how wrong the model was."""

    method: str  # none | ratio | components
    factors: dict[str, float] = field(default_factory=dict)  # component -> multiplier
    memory_factor: float = 1.0
    n_step: int = 0
    n_memory: int = 0
    n_oom: int = 0
    mape_before: float | None = None  # step time, raw planner vs measured (fraction)
    mape_after: float | None = None  # step time, calibrated vs measured (in sample)
    loo_mape: float | None = None  # leave-one-out MAPE of the chosen method
    memory_mape_before: float | None = None
    memory_mape_after: float | None = None
    memory_method: str = "none"  # none | ratio | terms | terms+sets (memfit.py)
    memory_factors: dict[str, float] = field(default_factory=lambda: {t: 1.0 for t in TERMS})
    memory_loo_mape: float | None = None  # heaviest stage, leave-one-layout-out
    memory_band: float = memfit.DEFAULT_BAND  # relative half-width of a calibrated peak

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def memory_scale(self) -> dict[str, float]:
        """What the planner's memory rule multiplies each term by (planner memory_factor=...)."""
        return dict(self.memory_factors)

    def memory_summary(self) -> str:
        """One line for the round's event: method, factors, band."""
        if not self.memory_method.startswith("terms"):
            return f"memory factor {self.memory_factor:.3f} (band +-{self.memory_band:.0%})"
        fs = ", ".join(f"{t} {v:.2f}" for t, v in self.memory_factors.items())
        return f"memory per term: {fs} (band +-{self.memory_band:.0%})"

    def predict(self, components: dict[str, float], probe_scale: float | None = None) -> float:
        """The calibrated step of raw planner components; with a rank probe's `probe_scale` the composed step
        (compose.step: the probe's measured compute + the calibrated communication)."""
        return compose.step(self.factors, components, probe_scale)

    def predict_row(self, row: Observation) -> float:
        """`predict` for an observation: composed when its layout was probed."""
        return self.predict(row.raw_components, row.probe_scale)


def _mape(pred: Sequence[float], meas: Sequence[float]) -> float | None:
    pairs = [(p, m) for p, m in zip(pred, meas) if m]
    return sum(abs(p - m) / m for p, m in pairs) / len(pairs) if pairs else None


BUBBLE_PASSES = 4  # alternations of the bubble's column and the factors (the bench's figures are with 4)


def _fit_components(rows: list[Observation], names: list[str]) -> dict[str, float]:
    """Regularized NNLS on relative residuals over the components that vary in these rows. A probed row's
    compute and optimizer are measured (compose.split): it fits the rest on its residual. The bubble follows the
    scaled stage time (steptime.scaled), so the step is linear in the bubble's own factor with the others held
    and the reverse: its column is refreshed from the factors of the pass before."""
    y = np.array([r.step_s for r in rows], dtype=float)
    parts = [compose.split(r.raw_components, r.probe_scale) for r in rows]
    target = np.array([1.0 - fixed / yi for (fixed, _), yi in zip(parts, y, strict=True)])
    factors = {c: 1.0 for c in names}
    for _ in range(BUBBLE_PASSES):
        cols = [
            [rest.get(c, 0.0) * (_bubble_ratio(factors, r) if c == "bubble" else 1.0) for c in names]
            for r, (_, rest) in zip(rows, parts, strict=True)
        ]
        a = np.array(cols, dtype=float) / y[:, None]
        live = [i for i, c in enumerate(names) if a[:, i].max() > 1e-6]
        if not live:
            return factors
        x = toward_one(a[:, live], target, REG)
        for i, j in enumerate(live):
            factors[names[j]] = float(x[i])
    return factors


def _bubble_ratio(factors: dict[str, float], row: Observation) -> float:
    """The scaled stage time over the raw one for this row under `factors`: what the bubble's column carries."""
    raw_bubble = compose.components(row.raw_components, row.probe_scale).get("bubble", 0.0)
    if raw_bubble <= 0:
        return 1.0
    return compose.calibrated({**factors, "bubble": 1.0}, row.raw_components, row.probe_scale)["bubble"] / raw_bubble


def _ratio(rows: list[Observation]) -> float:
    """The one factor: median of measured / predicted over what calibration scales (a probed row's residual
    over its unmeasured components). The bubble keeps factor 1 and follows the scaled stage time, so a row's
    step is affine in the ratio: p0 + ratio x p1."""
    ratios = []
    for r in rows:
        p0 = compose.step(_ratio_factors(r.raw_components, 0.0), r.raw_components, r.probe_scale)
        p1 = compose.step(_ratio_factors(r.raw_components, 1.0), r.raw_components, r.probe_scale) - p0
        if p1 > 0:
            ratios.append(max(0.0, r.measured_step_s - p0) / p1)
    return float(statistics.median(ratios)) if ratios else 1.0


def _ratio_factors(names: Iterable[str], ratio: float) -> dict[str, float]:
    """The ratio method's factors: `ratio` on every component but the bubble, which follows the stage time."""
    return {c: 1.0 if c == "bubble" else ratio for c in names}


def _component_names(rows: list[Observation]) -> list[str]:
    names: list[str] = []
    for r in rows:
        for c in r.raw_components:
            if c not in names:
                names.append(c)
    return names


def _predict(factors: dict[str, float], row: Observation) -> float:
    return compose.step(factors, row.raw_components, row.probe_scale)


def _loo(rows: list[Observation], names: list[str], method: str) -> float | None:
    if len(rows) < 2:
        return None
    errs = []
    for i, held in enumerate(rows):
        rest = rows[:i] + rows[i + 1 :]
        if method == "ratio":
            pred = _predict(_ratio_factors(names, _ratio(rest)), held)
        else:
            pred = _predict(_fit_components(rest, names), held)
        errs.append(abs(pred - held.measured_step_s) / held.measured_step_s)
    return sum(errs) / len(errs)


def memory_factor(rows: Sequence[Observation], *, hbm_gb: float, margin_gb: float) -> float:
    """Robust ratio of measured to predicted peak, pushed up by OOMs, capped by layouts that ran.

    Measured truth wins both ways: an OOMed layout must come out over capacity, a layout that ran must
    stay feasible. When the two disagree (the model orders their memory wrongly) the layouts that ran win
    and the OOM is left to `select.oom_dominated`, which prunes by knob order instead.
    """
    ok = [r for r in rows if r.peak_gb and r.raw_memory_gb > 0]
    factor = statistics.median(r.measured_peak_gb / r.raw_memory_gb for r in ok) if ok else 1.0
    usable = max(hbm_gb - margin_gb, 1e-9)
    ooms = [r for r in rows if r.failure_class == Failure.OOM and r.raw_memory_gb > 0]
    if ooms:
        factor = max(factor, max(usable / r.raw_memory_gb for r in ooms) * 1.02)
    ran = [r for r in rows if r.ok and r.raw_memory_gb > 0]
    cap = min((usable / r.raw_memory_gb for r in ran), default=float("inf"))
    factor = min(factor, cap)
    return float(min(max(factor, MEMORY_CLAMP[0]), MEMORY_CLAMP[1]))


def calibrate(rows: Sequence[Observation], *, hbm_gb: float, margin_gb: float) -> Fit:
    """Fit step-time factors and the memory factor on every measured row; report errors before/after."""
    ok = [r for r in rows if r.ok and r.raw_step_s > 0]
    names = _component_names(ok)
    fit = Fit(
        method="none",
        factors={c: 1.0 for c in names},
        n_step=len(ok),
        n_memory=sum(1 for r in rows if r.peak_gb),
        n_oom=sum(1 for r in rows if r.failure_class == Failure.OOM),
    )
    fit.memory_factor = memory_factor(rows, hbm_gb=hbm_gb, margin_gb=margin_gb)
    mf = memfit.fit_memory(rows, hbm_gb=hbm_gb, ratio=fit.memory_factor)
    fit.memory_method, fit.memory_factors, fit.memory_loo_mape, fit.memory_band = (
        mf.method,
        mf.factors,
        mf.loo_mape,
        mf.band,
    )
    mem_rows = [r for r in rows if r.peak_gb and r.raw_memory_gb > 0]
    fit.memory_mape_before = _mape([r.raw_memory_gb for r in mem_rows], [r.measured_peak_gb for r in mem_rows])
    fit.memory_mape_after = _mape([_calibrated_peak(fit, r) for r in mem_rows], [r.measured_peak_gb for r in mem_rows])
    if not ok:
        return fit
    fit.mape_before = _mape([r.raw_step_s for r in ok], [r.measured_step_s for r in ok])
    ratio = _ratio(ok)
    fit.method, fit.factors = "ratio", _ratio_factors(names, ratio)
    fit.loo_mape = _loo(ok, names, "ratio")
    if len(ok) >= MIN_ROWS_COMPONENTS and names:
        loo_c = _loo(ok, names, "components")
        if loo_c is not None and (fit.loo_mape is None or loo_c < fit.loo_mape):
            fit.method, fit.factors, fit.loo_mape = "components", _fit_components(ok, names), loo_c
    fit.mape_after = _mape([_predict(fit.factors, r) for r in ok], [r.measured_step_s for r in ok])
    return fit


def _calibrated_peak(fit: Fit, r: Observation) -> float:
    if fit.memory_method.startswith("terms") and r.raw_memory_terms:
        return memfit.peak(r.raw_memory_terms, fit.memory_factors, r.layout.recompute)[0]
    return r.raw_memory_gb * fit.memory_factor


@dataclass(frozen=True)
class MemoryEstimate:
    """A layout's heaviest-stage peak: raw planner, calibrated, and the calibrated band [lo, hi] (GB)."""

    raw_gb: float
    peak_gb: float
    lo_gb: float
    hi_gb: float
    stage: int

    def surely_fits(self, *, hbm_gb: float, margin_gb: float) -> bool:
        return self.hi_gb + margin_gb <= hbm_gb

    def surely_ooms(self, *, hbm_gb: float) -> bool:
        """Even the band's low end is over HBM (the OOM line has no margin)."""
        return self.lo_gb > hbm_gb


def memory_estimate(
    fit: Fit | None, terms_by_stage: Sequence[dict[str, float]], recompute: Sequence[str] = ()
) -> MemoryEstimate:
    """The calibrated peak of a layout from its raw per-stage terms (Prediction.memory_terms_by_stage) and its
    recompute set (Layout.recompute), and its uncertainty: +- the fit's leave-one-out band
    (memfit.DEFAULT_BAND with no fit)."""
    if not terms_by_stage:
        raise ValueError("memory_estimate needs the layout's per-stage memory terms")
    raw = memfit.peak(terms_by_stage, 1.0)[0]
    scale: dict[str, float] | float = fit.memory_scale if fit is not None else 1.0
    band = fit.memory_band if fit is not None else memfit.DEFAULT_BAND
    pk, stage = memfit.peak(terms_by_stage, scale, recompute)
    return MemoryEstimate(raw_gb=raw, peak_gb=pk, lo_gb=pk * (1.0 - band), hi_gb=pk * (1.0 + band), stage=stage)


def within_band(est: MemoryEstimate, *, hbm_gb: float, margin_gb: float) -> bool:
    """HBM lies inside the layout's band: the model can neither keep it (surely fits) nor drop it (surely
    OOMs), so a cheap fit probe (start-up + a few iterations, reading max-reserved) should decide."""
    return not est.surely_fits(hbm_gb=hbm_gb, margin_gb=margin_gb) and not est.surely_ooms(hbm_gb=hbm_gb)
