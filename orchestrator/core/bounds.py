"""The range of every numeric config field, declared beside its default and checked by one function.

Why: a value outside its range (a zero screen resolution, a negative poll interval, an empty search list,
a NaN lease) otherwise fails rounds later as a traceback, or silently as a wrong window. The schema
(orchestrator/core/schema.py) declares each numeric field with `ranged(default, lo, hi)` (or `gt=` for an
open lower bound); `violation(cfg)` walks the composed config once, at compose time, before anything is
written, and names the first field out of range. stdlib only, like the schema.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
KEY = "range"  # the dataclass field metadata key


@dataclass(frozen=True)
class Range:
    """lo <= value <= hi (gt: lo < value); None: unbounded on that side. A float must also be finite. A list
    field's range holds for each of its values, and `nonempty` asks for at least one."""

    lo: float | None = None
    hi: float | None = None
    gt: bool = False  # lo itself is excluded
    nonempty: bool = False

    def admits(self, value: Any) -> bool:
        if isinstance(value, list):
            return (bool(value) or not self.nonempty) and all(self._admits(v) for v in value)
        return self._admits(value)

    def _admits(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return True  # None where the field allows it; a non-numeric list entry (a module set)
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.gt else value < self.lo):
            return False
        return self.hi is None or value <= self.hi

    def text(self, integer: bool) -> str:
        """'an integer >= 1', 'a finite number > 0 and <= 1', 'a non-empty list of integers >= 1'."""
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.gt else '>='} {_num(self.lo)}")
        if self.hi is not None:
            parts.append(f"<= {_num(self.hi)}")
        what = "an integer" if integer else "a finite number"
        bound = f"{what} {' and '.join(parts)}".rstrip()
        if not self.nonempty:
            return bound
        return f"a non-empty list, each value {bound}" if parts else "a non-empty list"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def ranged(
    default: T, lo: float | None = None, hi: float | None = None, *, gt: float | None = None, nonempty: bool = False
) -> T:
    """A dataclass field with a default and its range (typed as its default for the type checker)."""
    return field(default=default, metadata={KEY: _range(lo, hi, gt, nonempty)})


def ranged_list(
    factory: Callable[[], T],
    lo: float | None = None,
    hi: float | None = None,
    *,
    gt: float | None = None,
    nonempty: bool = False,
) -> T:
    """A list field (default_factory) whose every value is in the range."""
    return field(default_factory=factory, metadata={KEY: _range(lo, hi, gt, nonempty)})


def _range(lo: float | None, hi: float | None, gt: float | None, nonempty: bool) -> Range:
    if gt is not None:
        return Range(lo=gt, hi=hi, gt=True, nonempty=nonempty)
    return Range(lo=lo, hi=hi, nonempty=nonempty)


def range_of(f: dataclasses.Field[Any]) -> Range | None:
    return f.metadata.get(KEY)


@dataclass(frozen=True)
class Violation:
    key: str  # dotted, e.g. stage.screen.resolution
    value: Any
    allowed: str

    def message(self) -> str:
        fix = "fix the override or the YAML under conf/"
        return f"{self.key}={self.value!r} is out of range: it must be {self.allowed} ({fix})"


def violation(cfg: Any, prefix: str = "") -> Violation | None:
    """The first field of the dataclass tree `cfg` whose value is outside its declared range, else None."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found = violation(value, key + ".")
            if found is not None:
                return found
            continue
        r = range_of(f)
        if r is not None and not r.admits(value):
            return Violation(key, value, r.text(integer="float" not in str(f.type)))
    return None
