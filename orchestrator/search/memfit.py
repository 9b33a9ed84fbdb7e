"""Per-term memory calibration: model states, activations and buffers, each with its own factor.

Why per term: the planner's error does not sit in one place. Weights, gradients and optimizer state are
exact byte counts; the analytic activation estimate is routinely 2-3x off (and differently per recompute
set); buffers depend on the allocator and the dispatcher library. One global factor cannot repair the
activation term without wrecking the others, so a layout whose activations are over-predicted stays
pruned in every round (issue 12).

Rows: one per measured PP stage (Megatron prints one memory line per pipeline stage from its DP-rank-0
ranks; the ledger keeps per-rank peaks with their PP stage), each the planner's raw terms of that stage and
its measured peak. measured ~= sum_t f_t x term_t is fitted by non-negative least squares on relative
residuals, each layout weighing the same whatever its PP, regularized toward 1 (a term the rows cannot
separate keeps its analytic value), the same style as the step-time fit. On top, each measured recompute
set may get its own activation multiplier (fit_sets), a set never measured the measured sets' spread
upward. An OOM says the layout's true peak exceeded HBM (a lower bound): while the fit predicts an OOMed
layout under HBM, its heaviest stage joins the rows at HBM (one of a recompute set no measured layout used
moves only that set's multiplier). With fewer than MIN_LAYOUTS measured layouts, or when leave-one-layout-out
says the per-term fit generalizes worse, one ratio is used for every term (calibrate.memory_factor).

The error band: each measured layout's heaviest stage predicted by a fit without that layout; the band is
the largest relative miss (at least MIN_BAND). `calibrate.memory_estimate` applies it to any layout. Any
Observation with a peak (stage_peaks_gb or peak_gb) is a row, measured step or not: a fit probe's
max-reserved lines count once the ledger holds them as its result (history.observations).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from orchestrator.core.failures import Failure
from orchestrator.plan.memory import TERMS, recompute_key, scaled_terms
from orchestrator.search.nnls import toward_one
from orchestrator.search.types import Observation

REG = 0.01  # pull toward 1 per term, in squared relative error per layout
MIN_LAYOUTS = 4  # fewer measured layouts: one ratio (three terms from three layouts would just interpolate)
MIN_BAND = 0.03  # allocator jitter between runs of one layout: no band is narrower
DEFAULT_BAND = 0.30  # before any leave-one-out: analytic totals are often 20-30% off (activations 2-3x)
OOM_PASSES = 4
MIN_SET_LAYOUTS = 1  # a recompute set gets its own activation multiplier once one of its layouts is measured
REG_SET = 0.02  # pull of that multiplier toward 1 (same units as REG)
OOM_OVER = 1.02  # an OOMed layout's heaviest stage joins the rows just over HBM

Stage = tuple[Mapping[str, float], float]  # (raw terms of one PP stage, measured peak GB)


@dataclass
class MemoryFit:
    """Per-term memory factors, the evidence behind them and the leave-one-out error band."""

    method: str = "none"  # none | ratio | terms | terms+sets (per-recompute-set activation multipliers)
    factors: dict[str, float] = field(default_factory=lambda: {t: 1.0 for t in TERMS})
    n_layouts: int = 0  # measured layouts with per-stage (or heaviest-rank) peaks
    n_rows: int = 0  # PP-stage rows
    n_oom_rows: int = 0  # OOMed layouts that had to join the rows at HBM
    loo_mape: float | None = None  # heaviest stage, leave-one-layout-out, chosen method
    loo_mape_ratio: float | None = None
    loo_mape_terms: float | None = None
    band: float = DEFAULT_BAND  # relative half-width of a calibrated peak's uncertainty


def layout_stages(r: Observation) -> list[Stage]:
    """A measured layout's rows: every PP stage with a measured peak, else its heaviest rank's peak against
    the stage the planner predicts heaviest (a workload that reports one number)."""
    terms = r.raw_memory_terms
    if not terms:
        return []
    rows: list[Stage] = [(terms[s], gb) for s, gb in sorted(r.stage_peaks_gb.items()) if 0 <= s < len(terms) and gb > 0]
    if rows:
        return rows
    if r.peak_gb:
        top = max(range(len(terms)), key=lambda i: sum(terms[i].values()))
        return [(terms[top], r.peak_gb)]
    return []


def peak(
    terms_by_stage: Sequence[Mapping[str, float]], factors: Mapping[str, float] | float, recompute: Sequence[str] = ()
) -> tuple[float, int]:
    """(calibrated heaviest-stage peak, its stage) of one layout's raw per-stage terms."""
    vals = [scaled_terms(t, factors, recompute) for t in terms_by_stage]
    i = max(range(len(vals)), key=lambda k: (vals[k], -k))
    return vals[i], i


def fit_terms(layouts: Sequence[Sequence[Stage]]) -> dict[str, float]:
    """Regularized NNLS on relative residuals; each layout's rows share weight 1 (a PP=16 layout does not
    outvote sixteen PP=1 layouts)."""
    a_rows, b = [], []
    for stages in layouts:
        w = 1.0 / np.sqrt(len(stages))
        for terms, y in stages:
            a_rows.append([w * terms.get(t, 0.0) / y for t in TERMS])
            b.append(w)
    factors = {t: 1.0 for t in TERMS}
    if not a_rows:
        return factors
    a = np.array(a_rows, dtype=float)
    live = [i for i in range(len(TERMS)) if a[:, i].max() > 1e-6]
    if not live:
        return factors
    x = toward_one(a[:, live], np.array(b), REG)
    for i, j in enumerate(live):
        factors[TERMS[j]] = float(x[i])
    return factors


def fit_sets(
    layouts: Sequence[Sequence[Stage]], sets: Sequence[Sequence[str]], factors: Mapping[str, float]
) -> dict[str, float]:
    """`factors` plus one activation multiplier per recompute set measured on >= MIN_SET_LAYOUTS layouts.

    Why: each recompute set keeps different tensors (full keeps layer inputs, a selective set drops its
    modules'), so the activation estimate errs by a different factor per set. Least squares on the same
    relative residuals with the shared factors fixed, pulled toward 1 (REG_SET): closed form per set. A set
    with no multiplier gets "activations@*" = 1 + the largest measured deviation: sets are known to differ
    by that much, and its layouts are the ones calibration would otherwise revive on a guess (an OOM)."""
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    count: dict[str, int] = {}
    for stages, rc in zip(layouts, sets):
        k = recompute_key(rc)
        count[k] = count.get(k, 0) + 1
        w = 1.0 / len(stages)
        for terms, y in stages:
            a = factors.get("activations", 1.0) * terms.get("activations", 0.0) / y
            rest = sum(factors.get(t, 1.0) * v for t, v in terms.items() if t != "activations") / y
            num[k] = num.get(k, 0.0) + w * a * (1.0 - rest)
            den[k] = den.get(k, 0.0) + w * a * a
    out = {t: float(factors.get(t, 1.0)) for t in TERMS}
    for k, n in count.items():
        if n >= MIN_SET_LAYOUTS and den[k] > 1e-12:
            out[f"activations@{k}"] = max(0.0, (num[k] + REG_SET) / (den[k] + REG_SET))
    spread = [abs(v - 1.0) for k, v in out.items() if k.startswith("activations@")]
    if spread:  # a set never measured may err as far as the measured ones differ: assume it errs upward
        out["activations@*"] = 1.0 + max(spread)
    return out


def _with_ooms(
    layouts: list[list[Stage]], sets: list[Sequence[str]], ooms: Sequence[Observation], hbm_gb: float, per_set: bool
) -> tuple[dict, int]:
    """The fit (shared terms, then per-set multipliers when `per_set`), then each OOMed layout still predicted
    under HBM joins the rows as one more layout (its heaviest stage just over HBM: the least its true peak
    can be), until none is left under or OOM_PASSES. A pull, not a hard constraint: when the terms cannot
    reconcile an OOM with the layouts that ran, the measured rows keep their say and select.oom_dominated
    prunes the OOM's knob-order twins instead.

    An OOM of a recompute set no measured layout shares moves only that set's activation multiplier: it says
    that set keeps more than estimated, nothing about the model states or the measured sets' activations
    (issue 19's `mixed` s112: selective-recompute OOMs pulled the shared factors up until the measured
    full-recompute layouts were predicted 9-23% high, and the optimum, a full-recompute layout, stayed pruned)."""
    joined: dict[str, tuple[Stage, Sequence[str]]] = {}
    measured = {recompute_key(rc) for rc in sets}

    def fit() -> dict[str, float]:
        rows = [*layouts, *([st] for st, _ in joined.values())]
        rcs = [*sets, *(rc for _, rc in joined.values())]
        f = fit_terms([st for st, rc in zip(rows, rcs) if recompute_key(rc) in measured])
        if per_set:
            return fit_sets(rows, rcs, f)
        alone = [(st, rc) for st, rc in zip(rows, rcs) if recompute_key(rc) not in measured]
        if not alone:
            return f
        own = fit_sets([st for st, _ in alone], [rc for _, rc in alone], f)
        return {**f, **{k: v for k, v in own.items() if k.startswith("activations@") and k != "activations@*"}}

    factors = fit()
    for _ in range(OOM_PASSES):
        new = [
            o for o in ooms if o.key not in joined and peak(o.raw_memory_terms, factors, o.layout.recompute)[0] < hbm_gb
        ]
        if not new:
            break
        for o in new:
            top = peak(o.raw_memory_terms, factors, o.layout.recompute)[1]
            joined[o.key] = ((o.raw_memory_terms[top], hbm_gb * OOM_OVER), o.layout.recompute)
        factors = fit()
    return factors, len(joined)


def _heaviest_measured(stages: Sequence[Stage]) -> Stage:
    return max(stages, key=lambda s: s[1])


def _ratio_of(layouts: Sequence[Sequence[Stage]]) -> float:
    return float(statistics.median(y / max(sum(t.values()), 1e-9) for t, y in map(_heaviest_measured, layouts)))


def _loo(layouts: list[list[Stage]], sets: list[Sequence[str]], method: str) -> list[float]:
    """Signed relative misses (measured / predicted - 1) of each layout's heaviest measured stage, predicted
    by the method (ratio | terms | sets) fitted on the other layouts."""
    out = []
    for i, held in enumerate(layouts):
        rest, rest_sets = layouts[:i] + layouts[i + 1 :], sets[:i] + sets[i + 1 :]
        scale: Mapping[str, float] | float
        if method == "ratio":
            scale = _ratio_of(rest)
        else:
            scale = fit_terms(rest)
            if method == "sets":
                scale = fit_sets(rest, rest_sets, scale)
        terms, y = _heaviest_measured(held)
        out.append(y / max(scaled_terms(terms, scale, sets[i]), 1e-9) - 1.0)
    return out


def fit_memory(rows: Sequence[Observation], *, hbm_gb: float, ratio: float) -> MemoryFit:
    """Per-term factors (and per-recompute-set activation multipliers) when enough layouts say, by
    leave-one-layout-out, that they generalize better than `ratio` (calibrate's single factor, already pushed
    by OOMs); else `ratio` on every term. The band comes from the chosen method's leave-one-out misses."""
    measured = [(st, r.layout.recompute) for r in rows if r.peak_gb or r.stage_peaks_gb if (st := layout_stages(r))]
    layouts = [st for st, _ in measured]
    sets: list[Sequence[str]] = [rc for _, rc in measured]
    ooms = [r for r in rows if r.failure_class == Failure.OOM and r.raw_memory_terms]
    fit = MemoryFit(factors={t: ratio for t in TERMS}, n_layouts=len(layouts), n_rows=sum(map(len, layouts)))
    if not layouts and not ooms:
        return fit
    fit.method = "ratio"
    if len(layouts) >= 2:
        loo_r = _loo(layouts, sets, "ratio")
        fit.loo_mape = fit.loo_mape_ratio = sum(map(abs, loo_r)) / len(loo_r)
        fit.band = max(MIN_BAND, max(map(abs, loo_r)))
    if len(layouts) >= MIN_LAYOUTS:
        distinct = len({recompute_key(rc) for rc in sets})
        for method in ("terms", "sets") if distinct > 1 else ("terms",):  # one set: a multiplier adds nothing
            loo = _loo(layouts, sets, method)
            mape = sum(map(abs, loo)) / len(loo)
            if method == "terms":
                fit.loo_mape_terms = mape
            if fit.loo_mape is None or mape < fit.loo_mape:
                fit.method, fit.loo_mape = method, mape
                fit.band = max(MIN_BAND, max(map(abs, loo)))
        if fit.method != "ratio":
            fit.factors, fit.n_oom_rows = _with_ooms(layouts, sets, ooms, hbm_gb, per_set=fit.method == "sets")
            fit.method = "terms+sets" if fit.method == "sets" else "terms"  # multipliers: keys of `factors`
    return fit
