"""The training curves the twin prints: lm loss and grad norm per iteration.

Why shared across layouts: a parallel layout must not change what the model learns, so the curve depends
only on (seed, iteration) plus LAYOUT_NOISE; TwinConfig.diverge_when names the layouts that carry an
injected numerical bug (a drift growing over DIVERGE_TAU iterations) the correctness gate must catch.
"""

from __future__ import annotations

import hashlib
import math
import random

from orchestrator.job.twin.job import TwinJob
from orchestrator.plan.layout import Layout

LAYOUT_NOISE = 1e-4  # relative, per layout and iteration: the packed path is not bit-deterministic
DIVERGE_TAU = 10.0  # iterations over which an injected divergence grows to its full scale


def diverges(layout: Layout, when: dict[str, int]) -> bool:
    """True when every knob named in `when` has that value in `layout` (an empty `when` never matches)."""
    return bool(when) and all(getattr(layout, k, None) == v for k, v in when.items())


def drift(it: int, scale: float) -> float:
    """Relative error of a diverging layout at iteration `it`: 0 at the start, growing towards `scale`."""
    return scale * (1.0 - math.exp(-it / DIVERGE_TAU))


def _layout_noise(tag: str, it: int, what: str) -> float:
    h = int(hashlib.sha256(f"{what}:{tag}:{it}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return LAYOUT_NOISE * (h - 0.5)


def loss_curve(
    seed: int, it: int, *, vocab_size: int, layout_tag: str = "", drift_scale: float = 0.0
) -> tuple[float, float]:
    """(lm loss, grad norm) at iteration `it`: a decreasing curve fixed by (seed, it), the same for every
    layout up to LAYOUT_NOISE, times (1 + drift) for a diverging layout (grad norm drifts twice as much)."""
    start = math.log(max(2, vocab_size))
    floor = 2.2
    shared = random.Random(f"twin-loss-{seed}-{it}").gauss(0, 0.01)
    loss = (floor + (start - floor) * math.exp(-it / 60.0) + shared) * (1.0 + _layout_noise(layout_tag, it, "loss"))
    gn = (0.8 + 6.0 * math.exp(-it / 25.0) + random.Random(f"twin-gn-{seed}-{it}").gauss(0, 0.02)) * (
        1.0 + _layout_noise(layout_tag, it, "gn")
    )
    d = drift(it, drift_scale)
    return loss * (1.0 + d), gn * (1.0 + 2.0 * d)


def curve(job: TwinJob, it: int) -> tuple[float, float]:
    """(lm loss, grad norm) of this job at iteration `it`."""
    scale = job.twin.diverge_scale if diverges(job.layout, job.twin.diverge_when) else 0.0
    return loss_curve(
        job.twin.seed, it, vocab_size=job.model.vocab_size, layout_tag=job.layout.short(), drift_scale=scale
    )
