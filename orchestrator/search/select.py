"""Choosing among candidates: one-factor neighbours, diverse top-k, budget, and the measured best.

Knobs are grouped the way a person changes them (each knob's `group` in orchestrator/core/knobs.py): PP and VPP
move together (VPP must divide the layers per PP stage), dispatcher and its flex backend move together. A
one-factor neighbour differs in exactly one group and in nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from orchestrator.core import ranking
from orchestrator.core.failures import Failure
from orchestrator.core.knobs import GROUPS
from orchestrator.plan.layout import Layout
from orchestrator.search.types import Observation

T = TypeVar("T")
EXCLUDED = "EXCLUDED"  # the failure class orchestrator.sweep.observe gives a candidate that failed parity
KNOBS: dict[str, tuple[str, ...]] = GROUPS  # group -> Layout fields, from the knob registry
_GROUPED = {f for fields in KNOBS.values() for f in fields}


def knob_value(layout: Layout, knob: str) -> tuple:
    return tuple(getattr(layout, f) for f in KNOBS[knob])


def value_label(knob: str, value: tuple) -> str:
    """A knob value (knob_value) as its fields read: "pp=4 vpp=4", "cp=2"."""
    return " ".join(f"{f}={v}" for f, v in zip(KNOBS[knob], value, strict=True))


def changed_knob(a: Layout, b: Layout) -> str | None:
    """The one knob group in which a and b differ, or None (equal, several knobs, or another field)."""
    if any(getattr(a, f) != getattr(b, f) for f in a.__dataclass_fields__ if f not in _GROUPED):
        return None
    diff = [k for k in KNOBS if knob_value(a, k) != knob_value(b, k)]
    return diff[0] if len(diff) == 1 else None


def diverse_top(
    items: Sequence[T], size: int, *, layout_of: Callable[[T], Layout], knobs: Sequence[str] = ("ep", "pp", "cp")
) -> list[T]:
    """Greedy: take items in the given (ranked) order, preferring one that covers knob values not yet seen.

    Each pick maximizes the number of uncovered (knob, value) pairs it adds; ties go to the better rank.
    Once every value is covered the rest follow rank order. The calibration then sees each knob vary.
    """
    chosen: list[T] = []
    covered: set[tuple[str, tuple]] = set()
    pool = list(items)
    while pool and len(chosen) < size:

        def gain(item) -> int:
            lay = layout_of(item)
            return sum((k, knob_value(lay, k)) not in covered for k in knobs)

        best_i = max(range(len(pool)), key=lambda i: (gain(pool[i]), -i))
        pick = pool.pop(best_i)
        chosen.append(pick)
        lay = layout_of(pick)
        covered.update((k, knob_value(lay, k)) for k in knobs)
    return chosen


def standing(row: Observation, order: int = 0) -> ranking.Standing:
    """How orchestrator.core.ranking sees an observation (a failed correctness gate reads EXCLUDED)."""
    return ranking.Standing(
        p50_s=row.step_s,
        p99_s=row.p99_s,
        peak_gb=row.peak_gb,
        fidelity=row.fidelity,
        partial=row.partial,
        excluded=row.failure_class == EXCLUDED,
        order=order,
    )


def measured_rank(rows: Iterable[Observation], *, full_only: bool = False) -> list[Observation]:
    """Measured rows, best first, by orchestrator.core.ranking (never predictions). full_only: only what may be
    a best (a promotion, the best); otherwise screened rows rank beside them, as they anchor a move."""
    indexed = list(enumerate(rows))
    return [r for _, r in ranking.ranked(indexed, lambda ir: standing(ir[1], ir[0]), screens=not full_only)]


def best_measured(rows: Iterable[Observation]) -> Observation | None:
    """The measured best (orchestrator.core.ranking): a screened p50 ranks candidates, it never decides the best."""
    top = ranking.best(list(enumerate(rows)), lambda ir: standing(ir[1], ir[0]))
    return top[1] if top is not None else None


def round_robin(lists: Sequence[Sequence[T]], limit: int, *, key: Callable[[T], str]) -> list[T]:
    """Merge ranked lists taking one from each in turn, skipping duplicates, up to limit items."""
    out: list[T] = []
    seen: set[str] = set()
    iters = [list(x) for x in lists]
    while len(out) < limit and any(iters):
        for lst in iters:
            while lst:
                item = lst.pop(0)
                if key(item) not in seen:
                    seen.add(key(item))
                    out.append(item)
                    break
            if len(out) >= limit:
                break
    return out


def _recompute_level(layout: Layout) -> int | None:
    if not layout.recompute:
        return 0
    return 2 if "full" in layout.recompute else None  # selective sets are not ordered among themselves


def needs_more_memory(a: Layout, b: Layout) -> bool:
    """True when `a` keeps at least as much per GPU as `b` on every memory knob (and differs nowhere else
    that matters): fewer or equal PP / TP / CP / EP shards, equal or larger micro-batch, no more recompute
    and no more offload, at the same VPP. The dispatcher is ignored (its buffers are second-order).
    Why VPP must be equal: the first stage's activations in flight are not monotone in VPP. Megatron's
    interleaved schedule warms up 2 (PP - 1) + (VPP - 1) x group microbatch-chunks of L / (PP x VPP) layers
    each (megatron/core/pipeline_parallel/schedules.py:913-914 on dev), against PP microbatches of L / PP
    layers without interleaving (:906): more than VPP 1, less the higher VPP goes. On twin:overpredicted an
    OOM at PP4 VPP2 pruned PP4 VPP4, the 1k optimum, which fits (bench seed 100)."""
    if not (a.pp <= b.pp and a.tp <= b.tp and a.cp <= b.cp and a.ep <= b.ep and a.etp <= b.etp and a.mbs >= b.mbs):
        return False
    if a.vpp != b.vpp:
        return False
    if set(a.offload) - set(b.offload):
        return False
    ra, rb = _recompute_level(a), _recompute_level(b)
    if ra is None or rb is None:
        return a.recompute == b.recompute or (rb is None and ra == 0)
    return ra <= rb


def same_memory(a: Layout, b: Layout) -> bool:
    """Each needs no more memory than the other along the knob order: they differ only where it looks away
    (the dispatcher), so one rank probe answers for both (a flex layout is probed with alltoall anyway)."""
    return needs_more_memory(a, b) and needs_more_memory(b, a)


def oom_dominated(layout: Layout, rows: Iterable[Observation]) -> bool:
    """A layout that needs at least as much memory as one that measured OOM will OOM too: skip it."""
    return any(r.failure_class == Failure.OOM and needs_more_memory(layout, r.layout) for r in rows)


def probe_margin_gb(pairs: Iterable[tuple[float, float]], default: float) -> float:
    """What a one-GPU rank probe cannot see (NCCL and dispatcher buffers), learned: the largest full-scale peak
    minus its own layout's probe peak, over (full-scale peak, probe peak) pairs of probed layouts that then
    ran at full scale; `default` (stage.probe_margin_gb) until one did. Never below 0."""
    seen = [full - probe for full, probe in pairs]
    return max(0.0, *seen) if seen else default


def ran(row: Observation) -> bool:
    """The layout ran on this stage's GPUs: measured, or a rank probe found it to fit (`probed_fit`: its peak
    plus the probe margin under HBM)."""
    return row.failure_class is None and (row.ok or row.probed_fit)


def fit_dominated(layout: Layout, rows: Iterable[Observation]) -> bool:
    """A layout that needs no more memory than one that ran (needs_more_memory, the knob order) fits too:
    evidence, so the memory model never prunes it (the mirror of oom_dominated)."""
    return any(ran(r) and needs_more_memory(r.layout, layout) for r in rows)
