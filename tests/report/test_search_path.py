"""Explained decisions: every proposal of a sweep stores why (move kind, fidelity, predicted gain and its
uncertainty) in the ledger, and `status` and the report show the search path from it."""

from __future__ import annotations

import pytest

from orchestrator.commands import status
from orchestrator.config import compose
from orchestrator.report import path
from tests.bench import searchlib as lib

KINDS = {"round0", "neighbour", "joint", "model-pick", "model-top", "promoted", "fit-probe", "coverage-probe"}


@pytest.mark.long
def test_a_sweep_records_why_each_candidate_was_proposed_and_shows_the_path(tmp_path):
    target = lib.Target("ext:cliffs")
    composed = compose(["+stage=1k", "cluster=local", *target.overrides()])
    with lib.fresh_ledger(str(tmp_path)) as led:
        run = lib.run_sweep(led, composed, target, "why", startup_s=300.0)
        cands = led.candidates("why")
        # a screened contender confirmed (or a probed layout measured) at the full window: one candidate, two launches
        rerun = [c for c in cands if c.decision.previous]
        assert len(cands) + len(rerun) == len(run.launches) >= composed.cfg.policy.schedule.round0_size + 1
        for c in rerun:
            assert c.decision.fidelity == "full" and c.decision.previous.fidelity in ("screen", "probe")
        for c in cands:
            d = c.decision.previous if c in rerun else c.decision
            assert d is not None and d.kind in KINDS and d.fidelity in ("full", "screen", "probe"), d
            if c.round > 0:  # later rounds explain the gain they expect over the best measured so far
                assert d.predicted_gain is not None and d.move.startswith(d.kind)
                assert (d.parent is not None) == (d.kind in ("neighbour", "joint"))
        rows = path.gather(led, "why")
        assert [r["key"] for r in rows] == [c.key for c in sorted(cands, key=lambda c: (c.round, c.id))]
        measured = [r for r in rows if r["step_p50_s"] is not None]
        assert measured[0]["new_best"]  # the first measurement is the best so far
        best = min(r["step_p50_s"] for r in rows if r["step_p50_s"] is not None)
        assert [r for r in rows if r["new_best"]][-1]["step_p50_s"] == best
        html = path.fragment(rows)
        assert "id='search-path'" in html and html.count("<tr") == len(rows) + 1
        info = status.gather(led, "why")
        assert info["search_path"] == rows and all(r["decision"] for r in info["candidates"])
        text = path.lines(rows)
        assert len(text) == len(rows) and any("new best" in line for line in text)
