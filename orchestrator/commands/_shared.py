"""What several commands share: the ledger they open, the verb they read, the table they print.

Why its own module: compare, best, ledger and db all need these, and none of them should import another
command (that made compare <-> ledger a cycle). The ledger URL comes from the composed config
(`ledger.url=...`, `ledger=postgres` reading ORCH_LEDGER_URL) and is never printed with its password.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.config import compose
from orchestrator.core.errors import UserError

PIPE_WIDTH = 400  # through a pipe there is no terminal to fit: whole rows for grep, a file or a pager
INT_MAX = 2**31 - 1  # the ledger's integer columns (PostgreSQL INTEGER) and a sane LIMIT


def whole_number(lo: int = 0, hi: int = INT_MAX) -> Callable[[str], int]:
    """An argparse type: an int in lo..hi, so a number the database cannot bind is a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is out of range {lo}..{hi}")
        return value

    return parse


def split_verb(overrides: Sequence[str], verbs: Sequence[str], command: str) -> tuple[str, list[str]]:
    """The verb is the one positional without '='; the rest are Hydra overrides."""
    words = [o for o in overrides if "=" not in o]
    if len(words) != 1 or words[0] not in verbs:
        raise UserError(f"usage: python -m orchestrator {command} {'|'.join(verbs)} [flags] [overrides]")
    return words[0], [o for o in overrides if "=" in o]


def open_ledger(overrides: Sequence[str]):
    """An existing ledger (these commands read; only `sweep` and `db upgrade` create one)."""
    from orchestrator.ledger.ledger import Ledger

    return Ledger.from_config(compose(overrides).cfg.ledger)


def console():
    """A rich Console as wide as the terminal; through a pipe (no terminal to fit), wide enough for whole rows."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=PIPE_WIDTH)


def _cell(value: Any, key: str = "") -> str:
    if value is None:
        return "-"
    if key == "key":
        return str(value)[:10]
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def natural_width(table: Any) -> int:
    """The columns `table` takes with no cell wrapped or cut (rendered once, as wide as it likes)."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=10_000, color_system=None).print(table)
    return max((len(line.rstrip()) for line in out.getvalue().splitlines()), default=0)


def fitted(
    columns: Sequence[str], priority: Sequence[str], width: int, build: Callable[[list[str]], Any]
) -> tuple[Any, list[str]]:
    """The table `build(shown)` makes of the most important `columns` that fit `width` without a cell wrapped
    (rich folds a table too wide into 3-letter cells), in their own order, and the columns left out. Importance:
    `priority` first (the layout's knobs, then its step), then the rest as listed."""
    order = [*[c for c in priority if c in columns], *[c for c in columns if c not in priority]]
    rank = {c: i for i, c in enumerate(order)}
    shown = list(columns)
    table = build(shown)
    while len(shown) > 1 and natural_width(table) > width:
        shown.remove(max(shown, key=lambda c: rank[c]))
        table = build(shown)
    return table, [c for c in columns if c not in shown]


def left_out_note(left: Sequence[str], width: int, how: str = "a wider terminal or --format csv/json") -> str:
    """The line under a table that left columns out to fit: which, and `how` to see every column."""
    return f"{len(left)} column(s) left out to fit {width} columns: {', '.join(left)} ({how} shows them)"


def print_table(
    rows: Sequence[dict[str, Any]],
    *,
    title: str = "",
    columns: list[str] | None = None,
    priority: Sequence[str] = (),
) -> None:
    """Rows as a rich table as wide as the terminal, columns chosen by `priority` where all would not fit."""
    from rich.table import Table

    cols = columns or (list(rows[0]) if rows else [])

    def build(shown: list[str]) -> Table:
        table = Table(title=title or None, title_justify="left")
        for c in shown:
            table.add_column(c, overflow="fold")
        for r in rows:
            table.add_row(*[_cell(r.get(c), c) for c in shown])
        return table

    out = console()
    table, left = fitted(cols, priority, out.width, build)
    out.print(table)
    if left:
        out.print(left_out_note(left, out.width, "a wider terminal, --columns or --format csv/json"), highlight=False)
