"""The live view: plain lines (one per change) off a terminal, a rich table on one."""

from __future__ import annotations

import io

from orchestrator.sweep.view import Snapshot, View


def snap(done: int, best=None) -> Snapshot:
    return Snapshot(
        sweep="s",
        round=1,
        counts={"queued": 1, "running": 2, "done": done, "failed": 0},
        best=best,
        gpu_hours=12.5,
        simulated=True,
    )


def test_plain_mode_prints_one_line_per_change():
    out = io.StringIO()
    with View(live=False, stream=out) as v:
        v.update(snap(1))
        v.update(snap(1))
        v.update(snap(2, {"step_p50_s": 1.234, "layout": "TP1 PP8"}))
        v.event("round 2: ...")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert "done 2" in lines[1] and "best 1.234 s TP1 PP8" in lines[1] and "(simulated)" in lines[1]


def test_not_a_tty_defaults_to_plain():
    assert View(stream=io.StringIO()).live_mode is False


def test_live_mode_renders_a_table():
    out = io.StringIO()
    with View(live=True, stream=out) as v:
        v.update(snap(3, {"step_p50_s": 2.0, "layout": "TP1 PP16"}))
        v.event("a decision")
    text = out.getvalue()
    for word in ("queued", "running", "done", "failed", "TP1 PP16", "simulated", "a decision"):
        assert word in text
