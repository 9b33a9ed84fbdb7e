"""A sweep's plain output (a log, CI, a pipe) fits a line (issue 49 item 6): every stdout line under 200
characters, the round's layouts and why each was chosen kept in its ledger event (`ledger events --format json`);
before, the round lines ran to 2,000 characters, one layout after another."""

from __future__ import annotations

import json

from orchestrator.sweep.view import PLAIN_WIDTH, folded
from tests.sweeplib import cli, ledger_url, sweep_args


def test_a_plain_sweep_prints_lines_under_200_characters_with_the_detail_in_its_events(tmp_path):
    got = cli("sweep", *sweep_args(tmp_path, "plain", "stage.budget.max_rounds=2"), "--plain")
    assert got.returncode == 0, got.stderr[-3000:]
    lines = got.stdout.splitlines()
    assert max(len(line) for line in lines) < 200, max(lines, key=len)
    rounds = [line for line in lines if line.startswith(("round 0: ", "round 1: ")) and "layout(s) (" in line]
    assert len(rounds) == 2, lines
    events = cli("ledger", "events", "--sweep", "plain", "--format", "json", f"ledger.url={ledger_url(tmp_path)}")
    assert events.returncode == 0, events.stderr
    planned = [e["data"] for e in json.loads(events.stdout) if e["kind"] == "round"]
    assert len(planned) == 2 and all(len(d["layouts"]) == len(d["keys"]) == len(d["reasons"]) for d in planned)
    assert all(d["layouts"][0].startswith("TP") for d in planned)


def test_a_long_line_folds_at_its_separators_and_nothing_is_lost():
    message = "config: " + "; ".join(f"part {i} " + "x" * 30 for i in range(20))
    lines = folded(message)
    assert len(lines) > 1 and all(len(line) <= PLAIN_WIDTH for line in lines)
    assert all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines).replace("  ", " ") == message.replace("  ", " ")
    assert folded("short") == ["short"]
    assert all(len(line) <= PLAIN_WIDTH for line in folded("y" * 500))  # no separator: cut at the width
