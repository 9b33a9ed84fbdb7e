"""A sweep's plain output (a log, CI, a pipe) fits a line and follows the rounds (issue 49 item 6): every stdout line
under 200 characters, the round's layouts and why each was chosen kept in its ledger event (`ledger events --format
json`; before, the round lines ran to 2,000 characters); `submitted` said as each job goes out (before, after the
round's local jobs had ended); the status line names the round under way (before, a round of confirms alone read as
the round before it)."""

from __future__ import annotations

import json
import re
import shlex
from types import SimpleNamespace

import pytest

from orchestrator.config import compose
from orchestrator.core.states import EventKind
from orchestrator.ledger.ledger import Ledger
from orchestrator.sweep.loop import Driver
from orchestrator.sweep.view import PLAIN_WIDTH, folded, folded_command
from tests.sweeplib import cli, ledger_url, new_sweep, sweep_args


@pytest.mark.long
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
    # each round's first job is said submitted before any job of that round is done
    for rnd in (0, 1):
        said = next(i for i, line in enumerate(lines) if line.startswith(f"round {rnd}: "))
        sent = next(i for i, line in enumerate(lines[said:]) if line.startswith("submitted "))
        done = [int(m.group(1)) for line in lines[said : said + sent] if (m := re.search(r" done (\d+) ", line))]
        assert len(set(done)) <= 1, lines[said : said + sent + 1]  # no job of the round ended before it
    assert re.search(r"^submitted 1 job\(s\): \S+ \(1/\d+ of this call\)$", got.stdout, re.M), got.stdout


def test_a_long_line_folds_at_its_separators_and_nothing_is_lost():
    message = "config: " + "; ".join(f"part {i} " + "x" * 30 for i in range(20))
    lines = folded(message)
    assert len(lines) > 1 and all(len(line) <= PLAIN_WIDTH for line in lines)
    assert all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines).replace("  ", " ") == message.replace("  ", " ")
    assert folded("short") == ["short"]
    assert all(len(line) <= PLAIN_WIDTH for line in folded("y" * 500))  # no separator: cut at the width


@pytest.mark.long
def test_the_status_line_names_the_round_under_way_when_it_adds_no_candidate(tmp_path):
    """A round of confirms alone (screened contenders at the full window) adds no candidate: its round event does."""
    with Ledger.open(ledger_url(tmp_path), create=True) as led:
        new_sweep(led, "confirms", compose(sweep_args(tmp_path, "confirms")))
        driver = SimpleNamespace(ledger=led, name="confirms")
        cands = [SimpleNamespace(round=0)]
        assert Driver._round(driver, cands) == 0  # type: ignore[arg-type]
        led.log_event("confirms", EventKind.ROUND, "round 1: 2 confirm(s)", data={"round": 1, "keys": []})
        assert Driver._round(driver, cands) == 1  # type: ignore[arg-type]
        led.log_event("confirms", EventKind.ROUND, "round 2: stored before the round was in its data")
        assert Driver._round(driver, cands) == 2  # type: ignore[arg-type]


def test_a_long_command_folds_with_shell_continuations_and_still_runs_as_one():
    """The sweep's closing commands carry the user's ledger URL: past the width they go on with ` \\` between
    words (never inside a quoted argument), and the lines pasted into a shell are the one command."""
    import subprocess

    words = ["printf", "%s|", "ledger.url=sqlite:///" + "d" * 150 + "/l.sqlite", "a b", "++x=1", "'q'"]
    command = " ".join(shlex.quote(w) for w in words)
    lines = folded_command("  its Megatron flags  ", command)
    assert len(lines) > 1 and all(line.endswith(" \\") for line in lines[:-1])
    assert all(len(line) <= PLAIN_WIDTH for line in lines if "d" * 150 not in line)  # one word is not cut
    pasted = "\n".join(lines)[len("  its Megatron flags  ") :]
    ran = subprocess.run(["bash", "-c", pasted], capture_output=True, text=True, check=True)
    assert ran.stdout == "".join(f"{w}|" for w in words[2:]), ran.stdout
