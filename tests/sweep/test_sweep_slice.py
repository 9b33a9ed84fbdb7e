"""The correctness gate inside a sweep: a slice-stage sweep on the twin runs every finalist beside its
reference layout (CP1), records parity in the ledger, and a layout with an injected numerical divergence
is excluded: `best` skips it and a later stage never promotes it."""

from __future__ import annotations

import pytest

from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger
from tests.sweeplib import assert_accounted, cli, ledger_url, sweep_args

DIVERGE = "++workload.twin.diverge_when={cp: 4}"


@pytest.mark.long
def test_slice_sweep_gates_finalists_and_never_promotes_a_divergent_layout(tmp_path):
    args = sweep_args(
        tmp_path,
        "slice-a",
        DIVERGE,
        "policy.search.promote_top_k=8",
        "stage.budget.max_runs=6",
        "policy.schedule.round0_size=6",
        stage="slice",
    )
    proc = cli("sweep", *args, "--plain", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "parity " in proc.stdout and "FAILED, excluded from promotion" in proc.stdout  # the live view says
    with Ledger.open(ledger_url(tmp_path)) as led:
        assert_accounted(led, "slice-a")
        measured = {m.candidate_id: m.layout for m in led.evidence.measured(sweep="slice-a")}
        verdicts = {cid: led.evidence.parity(cid) for cid in measured}
        assert all(verdicts.values()), "every measured finalist has a parity row"
        cands = {c.id: c for c in led.candidates("slice-a")}
        divergent = [cid for cid, lay in measured.items() if lay.cp == 4]
        healthy = [cid for cid, lay in measured.items() if lay.cp != 4]
        assert divergent and healthy, f"round 0 should cover CP4 and other CPs: {measured}"
        for cid in divergent:
            assert not verdicts[cid][-1].passed and "lm loss differs" in verdicts[cid][-1].detail
            assert cands[cid].status == "excluded"
        for cid in healthy:
            assert verdicts[cid][-1].passed and cands[cid].status == "done"
        best = queries.best(led, sweep="slice-a")
        assert best is not None and best["layout"]["cp"] != 4

    # A larger stage promoting from the slice never picks the excluded layouts as parents.
    bigger = sweep_args(
        tmp_path,
        "slice-b",
        DIVERGE,
        "stage.name=slice2x",
        "stage.gpus=128",
        "stage.promotes_from=slice",
        "stage.budget.max_runs=4",
        "stage.budget.max_rounds=1",
        "policy.schedule.round0_size=4",
        "parity.enabled=false",
        stage="slice",
    )
    proc = cli("sweep", *bigger, "--plain", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with Ledger.open(ledger_url(tmp_path)) as led:
        promoted = [c for c in led.candidates("slice-b") if c.edge_kind == "promoted-from"]
        assert promoted
        assert not {c.parent_id for c in promoted} & set(divergent)
