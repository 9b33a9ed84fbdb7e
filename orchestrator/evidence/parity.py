"""Numerical parity between a candidate layout and a reference layout (the correctness gate).

Why: a faster layout that computes something else must never win the performance race. Both runs
use the same seed and the stage's one data path: orchestrator.plan.argv gives every layout of a stage the
same data flags (with packed sequences the THD varlen dataset, its packing scheduler and per-token loss, at
CP=1 too), so the reference and the candidate see the same data, masks and loss normalisation, and their
argv differ only in layout flags (`data_differences` says which others differ; tests/plan/test_argv.py holds
the reference and a CP>1 candidate to none). We compare lm loss and grad norm step by step. The packed THD
path has no deterministic mode, so equality is judged within an explicit relative tolerance from config,
never exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.core.knobs import LAYOUT_FLAGS


@dataclass(frozen=True)
class Parity:
    passed: bool
    steps: int  # steps compared
    max_loss_diff: float | None  # max relative |loss_c - loss_r| / |loss_r|
    max_grad_norm_diff: float | None
    detail: str


def _max_rel(a: Sequence[float], b: Sequence[float]) -> float | None:
    pairs = list(zip(a, b))
    if not pairs:
        return None
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in pairs)


def compare(
    loss: Sequence[float],
    ref_loss: Sequence[float],
    grad: Sequence[float],
    ref_grad: Sequence[float],
    *,
    steps: int,
    loss_rtol: float,
    grad_norm_rtol: float,
) -> Parity:
    """Compare the first `steps` steps. Fewer steps than asked on either side fails: no verdict without evidence."""
    n = min(len(loss), len(ref_loss), steps)
    if n < steps:
        return Parity(
            False, n, None, None, f"only {n} of {steps} steps to compare (loss {len(loss)}, reference {len(ref_loss)})"
        )
    dl = _max_rel(loss[:n], ref_loss[:n])
    dg = _max_rel(grad[:n], ref_grad[:n]) if grad and ref_grad else None
    bad = []
    if dl is not None and dl > loss_rtol:
        step = max(range(n), key=lambda i: abs(loss[i] - ref_loss[i]) / max(abs(ref_loss[i]), 1e-12))
        bad.append(f"lm loss differs by {dl:.2e} (> {loss_rtol:.0e}) first worst at step {step + 1}")
    if dg is not None and dg > grad_norm_rtol:
        bad.append(f"grad norm differs by {dg:.2e} (> {grad_norm_rtol:.0e})")
    detail = (
        "; ".join(bad) if bad else f"{n} steps within loss rtol {loss_rtol:.0e}, grad-norm rtol {grad_norm_rtol:.0e}"
    )
    return Parity(not bad, n, dl, dg, detail)


def _flags(argv: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """flag -> its values (argparse: the last occurrence wins)."""
    out: dict[str, tuple[str, ...]] = {}
    flag: str | None = None
    values: list[str] = []
    for tok in [*argv, "--"]:
        if tok.startswith("--"):
            if flag is not None:
                out[flag] = tuple(values)
            flag, values = tok, []
        else:
            values.append(tok)
    return out


def data_differences(argv: Sequence[str], ref_argv: Sequence[str]) -> dict[str, tuple[tuple[str, ...] | None, ...]]:
    """The flags other than layout flags (orchestrator.core.knobs.LAYOUT_FLAGS) whose values differ between a
    candidate's and its reference's argv: flag -> (candidate's values, reference's; None = absent). Empty when
    both train on the same data with the same loss: the only comparison parity makes sense of."""
    a, b = _flags(argv), _flags(ref_argv)
    return {f: (a.get(f), b.get(f)) for f in sorted(set(a) | set(b)) if f not in LAYOUT_FLAGS and a.get(f) != b.get(f)}
