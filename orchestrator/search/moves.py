"""Joint moves over coupled knobs and the residual model that weighs unmeasured layouts by its uncertainty.

Joint moves follow the guide's experiment design (change one factor first, then a small joint search over
related variables): some knobs only pay off together, so a one-factor walk stops in a local trap.
  - CP with PP/VPP: CP restores the micro-batch count m that deeper PP needs, and moves memory per stage;
  - EP with the dispatcher backend: which backend overlaps best depends on how many nodes an EP group spans;
  - recompute with the memory-bound knobs (micro-batch size, PP depth): dropping recompute only fits once
    something else frees the memory, and the cheapest way to fit changes with it;
  - EP with PP: expert weights per GPU scale with (layers per PP stage) / EP, so a shallower pipeline
    fits only with wider EP (at 8k the bench's optimum is often PP4 EP64 next to a measured PP8 EP32,
    whose one-factor PP4 neighbour does not fit; without this pair 4 of 10 twin 8k rows missed, with it
    1 of 10, `tests/bench/bench_search.py --seed 0 --seed 1`).

Residual model: what calibration (a few multiplicative factors) cannot express is left in
log(measured / calibrated). A Bayesian ridge over one-hot knob values (plus the coupled pairs, and log2 of the
size knobs centred on the measured rows, so a trend seen at several values extends to one never run) predicts
that residual for unmeasured layouts with a posterior standard deviation: large where no measurement shares
the layout's knob values. The policy ranks unmeasured layouts by the optimistic bound
calibrated x exp(mean - explore x sd), so part of each round goes where the model is promising *or* blind.
Chosen over a bootstrap ensemble because it is deterministic (a resumed sweep proposes the same round) and
closed-form (the bench's 16 rows run in minutes on two cores).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from orchestrator.core.knobs import KNOBS as REGISTRY
from orchestrator.plan.layout import Layout
from orchestrator.search.select import _GROUPED, KNOBS, knob_value
from orchestrator.search.types import Observation

# The coupled knob groups (orchestrator/core/knobs.py GROUPS names) a joint move changes together.
COUPLED: tuple[tuple[str, str], ...] = (
    ("cp", "pp"),
    ("ep", "dispatcher"),
    ("recompute", "mbs"),
    ("recompute", "pp"),
    ("ep", "pp"),
)
NOISE_SD = 0.02  # relative spread of a measured p50 around the truth (run-to-run noise, lognormal)
PRIOR_SD_FLOOR = 0.05  # the residual the model is allowed before it has seen any: 5% per layout


def changed_knobs(a: Layout, b: Layout) -> frozenset[str] | None:
    """The knob groups in which a and b differ; None when a field outside every group differs (TP, ...)."""
    if any(getattr(a, f) != getattr(b, f) for f in a.__dataclass_fields__ if f not in _GROUPED):
        return None
    return frozenset(k for k in KNOBS if knob_value(a, k) != knob_value(b, k))


def joint_pair(a: Layout, b: Layout) -> tuple[str, str] | None:
    """The coupled pair when a and b differ in exactly the two groups of one, else None."""
    diff = changed_knobs(a, b)
    if diff is None or len(diff) != 2:
        return None
    return next((p for p in COUPLED if frozenset(p) == diff), None)


# The sizes the policy moves (the knob registry's integer knobs in a group: PP, VPP, CP, EP, micro-batch): a
# residual may follow their log2.
TRENDS: tuple[str, ...] = tuple(k.name for k in REGISTRY if k.base is int and k.group is not None)


def _features(layout: Layout) -> list[tuple[str, float]]:
    """One-hot knob values, the coupled pairs' joint values (what a joint move changes together), and log2 of
    each size field (TRENDS): a residual that grows with CP where CP4, CP8 and CP16 ran extends down to CP2,
    where one-hot features alone predict the measured rows' average (tests/search/test_policy_moves.py)."""
    out = [(f"{k}={knob_value(layout, k)}", 1.0) for k in KNOBS]
    out += [(f"{x}={knob_value(layout, x)}|{y}={knob_value(layout, y)}", 1.0) for x, y in COUPLED]
    out += [(f"log2 {k}", math.log2(getattr(layout, k))) for k in TRENDS]
    return out


@dataclass
class Residual:
    """Posterior of log(measured / calibrated) over knob features: mean and sd for any layout."""

    index: dict[str, int]
    weights: np.ndarray
    cov: np.ndarray  # posterior covariance of the weights
    n: int
    cov_prior: float = PRIOR_SD_FLOOR**2  # prior variance of one unseen feature's weight
    centre: dict[str, float] = field(default_factory=dict)  # each trend's mean over the measured rows

    def predict(self, layout: Layout) -> tuple[float, float]:
        """(mean, sd) of the log residual; unseen features carry the prior's sd."""
        x = np.zeros(len(self.index))
        unseen = 0.0
        for f, v in _features(layout):
            v -= self.centre.get(f, 0.0)
            if f in self.index:
                x[self.index[f]] = v
            else:
                unseen += v * v
        mean = float(x @ self.weights)
        var = float(x @ self.cov @ x) + unseen * self.cov_prior
        return mean, math.sqrt(max(var, 0.0))


def fit_residual(rows: Iterable[Observation], calibrated: Callable[[Observation], float]) -> Residual:
    """Bayesian ridge of log(measured / calibrated) on the knob features (`_features`) of every measured row.

    The prior sd per feature is sized so a fully unseen layout's residual sd equals the spread of the
    residuals seen so far (at least PRIOR_SD_FLOOR): the model doubts new regions as much as the planner
    has already been wrong."""
    ok = [r for r in rows if r.ok and calibrated(r) > 0]
    feats = sorted({f for r in ok for f, _ in _features(r.layout)})
    index = {f: i for i, f in enumerate(feats)}
    per_layout = len(_features(ok[0].layout)) if ok else len(KNOBS) + len(COUPLED)
    y = np.array([math.log(r.measured_step_s / calibrated(r)) for r in ok])
    spread = max(float(np.sqrt(np.mean(y**2))) if len(y) else 0.0, PRIOR_SD_FLOOR)
    tau2 = spread**2 / per_layout
    if not ok:
        return Residual(index={}, weights=np.zeros(0), cov=np.zeros((0, 0)), n=0, cov_prior=tau2)
    centre = {f"log2 {k}": float(np.mean([math.log2(getattr(r.layout, k)) for r in ok])) for k in TRENDS}
    x = np.zeros((len(ok), len(feats)))
    for i, r in enumerate(ok):
        for f, v in _features(r.layout):
            x[i, index[f]] = v - centre.get(f, 0.0)
    s2 = NOISE_SD**2
    a = x.T @ x / s2 + np.eye(len(feats)) / tau2
    cov = np.linalg.inv(a)
    w = cov @ x.T @ y / s2
    return Residual(index=index, weights=w, cov=cov, n=len(ok), cov_prior=tau2, centre=centre)


def optimistic(calibrated_s: float, mean: float, sd: float, explore: float) -> float:
    """The lower confidence bound on step time: what the layout may reach if the model errs in its favour."""
    return calibrated_s * math.exp(mean - explore * sd)


def distinct_anchors(rows: Sequence[Observation], k: int, knobs=("ep", "pp", "cp"), min_diff: int = 1) -> list:
    """Measured rows best first, each differing from every earlier anchor in >= min_diff of `knobs`."""
    from orchestrator.search.select import measured_rank

    out: list[Observation] = []
    for r in measured_rank(rows):
        if all(sum(knob_value(r.layout, kn) != knob_value(a.layout, kn) for kn in knobs) >= min_diff for a in out):
            out.append(r)
        if len(out) >= k:
            break
    return out
