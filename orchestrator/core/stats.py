"""The one percentile: linear interpolation between order statistics (numpy's default, Hyndman and Fan type 7).

Why in core: the node's router summary (job/instrument), the step-time summary of a job folder
(evidence/metrics) and the report's CDF marks (report/plots) must agree on what p50/p95/p99 are, and job/ may import
only core. Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile of `values`, q in [0, 100]; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])
