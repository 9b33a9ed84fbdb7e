"""Tables that fit the terminal (issue 49 item 6): at 100 and 120 columns `plan` shows the layout (TP/PP/CP/EP) and
the predicted step, and `compare` the layout and the measured step, each row on one line; the columns left out to
fit are named under the table. Before, `plan` at 120 columns hid TP/PP/CP/EP and the step, and `compare` wrapped
every cell into 3-letter pieces."""

from __future__ import annotations

import pytest
from rich.console import Console

from orchestrator.cli import main
from orchestrator.commands import _shared, compare
from orchestrator.ledger import queries


def table_lines(out: str, width: int) -> tuple[list[str], list[list[str]]]:
    """(header cells, data rows' cells) of the one rich table in `out`; every line within `width`."""
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    head = next(line for line in lines if line.startswith("┃"))
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
    return [c.strip() for c in head.strip("┃").split("┃")], rows


@pytest.mark.parametrize("width", [100, 120])
def test_plan_shows_the_layout_and_its_predicted_step_at_terminal_widths(capsys, monkeypatch, width):
    monkeypatch.setattr(_shared, "console", lambda: Console(width=width))  # a terminal this wide
    assert main(["plan", "+stage=1k", "--top", "3"]) == 0
    out = capsys.readouterr().out
    head, rows = table_lines(out, width)
    assert {"candidate", "tp", "pp", "cp", "ep", "step_time_s"} <= set(head), head
    assert len(rows) == 3 and all(r[0] for r in rows), rows  # no row wrapped onto a second line
    assert f"left out to fit {width} columns" in out


def test_plan_through_a_pipe_keeps_every_column(capsys, monkeypatch):
    assert main(["plan", "+stage=1k", "--top", "3"]) == 0
    out = capsys.readouterr().out
    head, _ = table_lines(out, 400)
    assert "layer_pattern" in head and "left out" not in out


@pytest.mark.parametrize("width", [100, 120])
def test_compare_keeps_whole_cells_and_the_layout_at_terminal_widths(capsys, monkeypatch, width):
    monkeypatch.setattr(_shared, "console", lambda: Console(width=width))  # a terminal this wide
    columns = list(queries.DEFAULT_COLUMNS)
    sample = {
        "sweep": "smoke-h200-twin",
        "round": 0,
        "key": "8533339e35f0",
        "tp": 1,
        "pp": 16,
        "vpp": 1,
        "cp": 4,
        "ep": 32,
        "etp": 1,
        "mbs": 1,
        "recompute": "mhc+mla_up_proj",
        "dispatcher": "flex:deepep",
        "status": "done",
        "fidelity": "full",
        "measured": "full",
        "step_p50_s": 43.2345,
        "step_p99_s": 44.01,
        "tokens_per_gpu": 758.3,
        "mfu": 0.2231,
        "peak_allocated_gb": 131.2,
        "token_drop": 0.0,
        "simulated": True,
    }
    assert set(sample) == set(columns)
    compare.emit([sample, {**sample, "pp": 8, "cp": 8}], "table", columns, "ledger x: 2 rows")
    out = capsys.readouterr().out
    head, rows = table_lines(out, width)
    assert {"tp", "pp", "cp", "ep", "step_p50_s", "status"} <= set(head), head
    assert len(rows) == 2, rows  # each row one line: no cell folded
    assert rows[0] == [_shared._cell(sample[c], c) for c in head]  # every cell whole, none cut or folded
    assert f"left out to fit {width} columns" in out
