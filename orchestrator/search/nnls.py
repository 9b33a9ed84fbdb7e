"""Non-negative least squares pulled toward 1: the one solver step calibration and the memory fit share.

Why its own module: the step-time calibration (search/calibrate) and the memory fit (search/memfit) both fit
factors that scale the planner's terms, must never go negative, and lean toward 1 (the planner as it is) where
rows say little; calibrate imports memfit, so the solver lives below both rather than in either.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (scipy's Lawson-Hanson active-set solver): factors are never negative."""
    x, _ = optimize.nnls(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    return np.asarray(x, dtype=float)


def toward_one(a: np.ndarray, b: np.ndarray, reg: float) -> np.ndarray:
    """argmin ||a x - b||^2 + reg ||x - 1||^2 subject to x >= 0: the rows' fit, each factor pulled toward 1."""
    n, pull = a.shape[1], np.sqrt(reg)
    return nnls(np.vstack([a, pull * np.eye(n)]), np.concatenate([np.asarray(b, dtype=float), pull * np.ones(n)]))
