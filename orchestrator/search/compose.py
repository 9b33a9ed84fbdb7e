"""The composed step: a rank probe's measured compute with the calibrated communication (issue 19 item 3).

A one-GPU rank probe (Megatron's --fake-process-group) runs one rank's partition of the N-GPU job with every
collective skipped, so its step is that rank's compute alone: its m microbatches' kernels and the optimizer
step, with no all-to-all, CP exchange, PP point-to-point, gradient sync, TP collective nor bubble. Only the
last rank prints Megatron's iteration lines (`print_rank_last`, dev megatron/training/training.py:3468), so a
probe's p50 is the last PP stage's compute-only step (`Observation.probe_step_s`); the planner's view of the
same number is `Prediction.probe_step_s` (`Observation.raw_probe_s`).

Why compose: the planner's compute is where its structure is most wrong (grouped-GEMM efficiency as a function
of tokens per expert, the kernels' efficiency curves, what each block costs), and one factor per component
fitted across layouts cannot follow an error that differs layout by layout. A probe measures it for the layout
itself, for a few one-GPU hours. So for a probed layout the compute and optimizer components are the planner's
scaled by `probe_scale` (measured / predicted compute-only step), the bubble (m x the stage time x f / (1 - f))
by the stage time that scaling gives, and the communication components keep their calibrated factors.
Calibration (calibrate.py) fits those factors on full-scale runs, each on its whole step: once a probed layout
ran at scale its probe no longer composes it (orchestrator/sweep/history.py says why). Without a probe a layout
is predicted as before.

A probe is never a step measurement: it is no best, no full-window result, no row of the step NNLS by itself
(orchestrator.core.ranking: a probe row's `step_s` is None).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from orchestrator.plan.steptime import scaled

MEASURED = ("compute", "optimizer", "offload")  # what a rank probe times (scaled by the probe, factor 1)


def components(raw: Mapping[str, float], probe_scale: float | None) -> dict[str, float]:
    """The raw planner components with a probe's measured compute in place (`probe_scale` = measured /
    predicted compute-only step): compute and optimizer x scale, the bubble following the stage time
    (steptime.scaled, the one rule). None: the raw components unchanged."""
    if probe_scale is None:
        return dict(raw)
    return scaled(raw, dict.fromkeys(MEASURED, probe_scale))


def split(raw: Mapping[str, float], probe_scale: float | None) -> tuple[float, dict[str, float]]:
    """(seconds a probe measured, the components calibration still scales). Without a probe: (0, raw)."""
    comp = components(raw, probe_scale)
    if probe_scale is None:
        return 0.0, comp
    fixed = sum(comp.pop(c, 0.0) for c in MEASURED)
    return fixed, comp


def calibrated(
    factors: Mapping[str, float], raw: Mapping[str, float], probe_scale: float | None = None
) -> dict[str, float]:
    """The composed components: the probe-measured ones as measured, the factors applied to the rest
    (steptime.scaled, the one rule: the bubble follows the scaled stage time); without a probe, the
    calibrated planner's."""
    return scaled(components(raw, probe_scale), factors, fixed=MEASURED if probe_scale is not None else ())


def step(factors: Mapping[str, float], raw: Mapping[str, float], probe_scale: float | None = None) -> float:
    """The composed step: the sum of `calibrated`."""
    return sum(calibrated(factors, raw, probe_scale).values())


def scale_bias(rows: Iterable, predict: Callable[[dict[str, float], float | None], float]) -> float:
    """How far under the step it then measured at scale the composed step of a probed layout ran: the least of
    measured / composed over the layouts rank-probed and then measured (full window or screen, not partial;
    Observation.earlier_probe_scale), never under 1; 1 before any was. What a one-GPU probe cannot see (the
    communication's drag on compute at scale, stragglers) the composition misses for every layout of a stage alike:
    on held-out twin:mixed s114 1k seven pairs read 1.34-1.53, and probed layouts whose composed step passed held the
    sweep open three rounds more, then ran 36-94% over it (docs/search-log.md "A running line and the probe's bias").
    The least ratio keeps the correction optimistic; under 1 (the composition over-prices) the searcher's rating
    (Policy.estimate) already lowers what knob values measured faster, and both at once lost a held-out row."""
    ratios = [
        r.step_s / c
        for r in rows
        if r.ok and not r.partial and (k := r.earlier_probe_scale) and (c := predict(r.raw_components, k)) > 0
    ]
    return max(1.0, min(ratios)) if ratios else 1.0
