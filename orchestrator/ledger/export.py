"""Ledger exports: the joined compare view (or one raw table) to CSV, Parquet or a pandas DataFrame.

pandas/pyarrow are an optional extra (`pip install 'dsv4-orchestrator[pandas]'`); CSV needs neither.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from orchestrator.ledger import models as m
from orchestrator.ledger import queries
from orchestrator.ledger.errors import LedgerError

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.ledger.ledger import Ledger

ALL_COLUMNS = tuple(queries.COLUMNS)
TABLES = tuple(sorted(m.Base.metadata.tables))


def rows(
    ledger: Ledger, *, table: str | None = None, columns: Sequence[str] | None = None, **filters: Any
) -> tuple[list[str], list[dict[str, Any]]]:
    """(column names, rows): the joined view with every column by default, or one raw table."""
    if table is None:
        cols = list(columns or ALL_COLUMNS)
        return cols, queries.compare(ledger, columns=cols, **filters)
    if table not in m.Base.metadata.tables:
        raise LedgerError(f"unknown table '{table}'; tables: {', '.join(TABLES)}")
    t = m.Base.metadata.tables[table]
    with ledger.store.read() as s:
        out = [dict(r._mapping) for r in s.execute(select(t).order_by(*t.primary_key.columns))]
    return [c.name for c in t.columns], out


def to_dataframe(ledger: Ledger, **kwargs: Any) -> pd.DataFrame:
    """A pandas DataFrame for notebooks: `to_dataframe(Ledger.open(url), sweep="s1")`."""
    try:
        import pandas as pd
    except ImportError:
        raise LedgerError("pandas is not installed: pip install 'dsv4-orchestrator[pandas]'") from None
    cols, data = rows(ledger, **kwargs)
    return pd.DataFrame.from_records(data, columns=cols)


def export(ledger: Ledger, path: str | Path, fmt: str | None = None, **kwargs: Any) -> int:
    """Write CSV or Parquet (format from `fmt` or the file suffix); returns the number of rows."""
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".") or "csv").lower()
    if fmt not in ("csv", "parquet"):
        raise LedgerError(f"export format '{fmt}' is not one of csv, parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        df = to_dataframe(ledger, **kwargs)
        for col in df.columns:  # JSON columns (dict/list) are stored as JSON text
            if df[col].map(lambda v: isinstance(v, (dict, list))).any():
                df[col] = df[col].map(lambda v: json.dumps(v) if isinstance(v, (dict, list)) else v)
        try:
            df.to_parquet(path, index=False)
        except ImportError:
            raise LedgerError("Parquet needs pyarrow: pip install 'dsv4-orchestrator[pandas]'") from None
        return len(df)
    cols, data = rows(ledger, **kwargs)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols)
        writer.writeheader()
        for r in data:
            writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})
    return len(data)
