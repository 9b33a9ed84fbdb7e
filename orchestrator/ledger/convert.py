"""Values in and out of the ledger: ORM objects -> typed rows, Python values -> what the columns accept.

Why one module: every write cleans its JSON the same way (PostgreSQL's json rejects NaN) and every read
hands out a frozen dataclass, never an ORM object that would outlive its session.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.core.decision import Decision
from orchestrator.core.knobs import Layout
from orchestrator.core.metrics import METRICS, Measured
from orchestrator.core.prediction import Predicted
from orchestrator.ledger.errors import LedgerError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

CHUNK = 5000  # keys per IN (...) list: below SQLite's variable limit

T = TypeVar("T")
R = TypeVar("R", bound="DataclassInstance")
E = TypeVar("E", bound=StrEnum)


def to_row(cls: type[R], obj: Any) -> R:
    """The dataclass `cls` filled from the ORM object's attributes of the same names, its JSON columns decoded."""
    return cls(**{f.name: decode(f.name, getattr(obj, f.name)) for f in fields(cls)})


# The JSON columns a row hands out typed (core's records), by field name: decoded here once, so no caller
# reads a layout or a decision by string key. The stored JSON is unchanged (Decision.to_dict, Layout.to_dict).
DECODE: dict[str, Any] = {"layout": Layout.from_dict, "decision": Decision.from_dict, "predicted": Predicted}


def decode(name: str, value: Any) -> Any:
    """A column's value as its row field holds it (a layout's, a decision's, a prediction's JSON -> Layout,
    Decision, Predicted)."""
    if name not in DECODE or isinstance(value, (Layout, Decision, Predicted)):
        return value
    return DECODE[name](value)


def measured(result: Any) -> Measured:
    """A stored result row's metrics (every registry column of the ORM `Result`), typed by core/metrics."""
    return Measured({k.name: getattr(result, k.name) for k in METRICS})


def encode(value: Any) -> Any:
    """A typed record back to the JSON its column stores (None stays None), cleaned."""
    if isinstance(value, (Layout, Decision)):
        return clean(value.to_dict())
    return None if value is None else clean(value)


def now() -> datetime:
    return datetime.now(UTC)


def clean(value: Any) -> Any:
    """JSON-safe copy: tuples to lists, NaN/inf to None (PostgreSQL's json rejects NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (dict, Predicted)):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def as_datetime(value: Any) -> datetime | None:
    """Accept datetime, ISO text or epoch seconds (sacct and submitit give all three)."""
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def member(cls: type[E], value: str, what: str) -> E:
    """`value` as a member of the StrEnum `cls` (orchestrator.core.states); a LedgerError naming the valid ones."""
    try:
        return cls(value)
    except ValueError:
        raise LedgerError(f"{what} '{value}' is not one of {', '.join(cls)}") from None


def chunks(seq: Sequence[T], n: int = CHUNK) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]
