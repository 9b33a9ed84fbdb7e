"""The ledger hands out typed records (core/decision.Decision, core/knobs.Layout), decoded once in
orchestrator/ledger/convert.py, while the stored JSON keeps the shape it always had: a decision written typed
reads back equal and is stored as Proposal.decision wrote it; an older ledger's decision (keys missing, keys this
code does not know) still reads, and its unknown keys survive a rewrite."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sqlalchemy import text

from orchestrator.core.decision import CutLine, Decision
from orchestrator.core.knobs import Layout
from orchestrator.core.states import Fidelity
from orchestrator.ledger.ledger import CandidateIn, Ledger
from orchestrator.search.types import Proposal

LAYOUT = Layout(tp=2, pp=8, ep=64, mbs=1, recompute=("moe_act",), dispatcher="flex", flex_backend="deepep")


@pytest.fixture
def led(tmp_path):
    with Ledger.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        ledger.create_or_get_sweep(
            "s1",
            stage="1k",
            config_yaml="stage: 1k\n",
            model="dsv4_pro",
            hardware="h100",
            workload="twin",
            provenance={},
        )
        yield ledger


def _stored(led: Ledger, cid: int):
    with led.store.read() as s:
        return s.execute(text("SELECT decision, layout FROM candidate WHERE id = :i"), {"i": cid}).one()


def _json(v):
    import json

    return json.loads(v) if isinstance(v, str) else v


def test_a_decision_round_trips_typed_and_its_stored_shape_is_unchanged(led):
    """Write typed -> the stored JSON is the dict Proposal.decision always stored -> read typed, equal."""
    prop = Proposal(
        key="k1",
        layout=LAYOUT,
        predicted={"step_time_s": 1.0},
        reason="neighbour:tp",
        parent_key="p" * 40,
        fidelity=Fidelity.SCREEN,
        measure_iters=20,
        predicted_gain=0.05,
        uncertainty=0.02,
        probe_ranks=(0, 7),
        after_seed=True,
        warmup_iters=50,
        cut=CutLine(1.2, 30, 10),
    )
    decision = prop.decision()
    (row,) = led.add_candidates("s1", [CandidateIn(key="k1", layout=LAYOUT, decision=decision)])
    stored, layout = (_json(v) for v in _stored(led, row.id))
    assert stored == {
        "kind": "neighbour",
        "move": "neighbour:tp",
        "fidelity": "screen",
        "measure_iters": 20,
        "predicted_gain": 0.05,
        "uncertainty": 0.02,
        "parent": "p" * 40,
        "revived": False,
        "probe_ranks": [0, 7],
        "after_seed": True,
        "warmup_iters": 50,
        "cut": {"step_s": 1.2, "after": 30, "skip": 10},
    }
    assert layout == LAYOUT.to_dict()
    back = led.candidate_by_key("s1", "k1")
    assert back is not None and back.decision == decision and back.layout == LAYOUT
    assert isinstance(back.layout, Layout) and back.decision.cut == CutLine(1.2, 30, 10)
    # a confirmation keeps the decision it replaces as `previous`, and a probe's ranks are found through it
    full = Decision(kind="confirm", move="confirm", fidelity=Fidelity.FULL).but(previous=back.decision)
    led.requeue(row.id, full, "confirm at the full window")
    again = led.candidate_by_key("s1", "k1")
    assert again is not None and again.decision == full and again.decision.probed_ranks() == (0, 7)
    assert _json(_stored(led, row.id)[0])["previous"] == stored


def test_an_old_shape_decision_still_reads_and_keeps_what_it_does_not_know(led):
    """A decision of an older ledger (only kind and fidelity, plus a key this code never wrote) reads with
    the defaults; rewriting it keeps the unknown key; a candidate without any decision runs full and cold."""
    (row, bare) = led.add_candidates(
        "s1", [CandidateIn(key="old", layout={"ep": 64}), CandidateIn(key="bare", layout={})]
    )
    with led.store.write() as s:
        s.execute(
            text("UPDATE candidate SET decision = :d WHERE id = :i"),
            {"d": '{"kind": "round0", "fidelity": "probe", "probe_ranks": [3], "hint": "from v1"}', "i": row.id},
        )
    old = led.candidate_by_key("s1", "old")
    assert old is not None and old.decision.stored
    assert (old.decision.kind, old.decision.fidelity, old.decision.move) == ("round0", Fidelity.PROBE, None)
    assert old.decision.probed_ranks() == (3,) and not old.decision.warms and old.decision.cut is None
    assert old.decision.extra == {"hint": "from v1"} and old.layout.ep == 64
    assert led.redecide(row.id, old.decision.but(seed_save=True), "test")
    rewritten = _json(_stored(led, row.id)[0])
    assert rewritten["hint"] == "from v1" and rewritten["seed_save"] is True and rewritten["probe_ranks"] == [3]
    none = led.candidate_by_key("s1", "bare")
    assert none is not None and not none.decision.stored and none.decision.fidelity == Fidelity.FULL
    assert _json(_stored(led, bare.id)[0]) is None  # as before: JSON null


def test_a_candidates_prediction_reads_typed_and_its_stored_dict_is_unchanged(led):
    """CandidateRow.predicted is core/prediction.Predicted: the stored dict as it was written (the search's raw
    numbers and factors beside the models' fields), the figures the history reads as typed properties, and the
    models' record decoded once; a candidate added by another tool (no raw numbers) says so with None."""
    from orchestrator.core.prediction import Predicted
    from orchestrator.search.types import prediction_dict
    from tests.ledger.test_ledger import make_items

    (item,) = make_items(1)
    stored = prediction_dict(
        item.predicted, raw_components={"compute": 4.0}, raw_step_s=9.0, raw_memory_gb=70.0, factors={"a2a": 1.2}
    )
    (row, _) = led.add_candidates("s1", [replace(item, predicted=stored), CandidateIn(key="bare", layout={})])
    got = led.candidate_by_key("s1", row.key)
    assert got is not None and isinstance(got.predicted, Predicted)
    assert dict(got.predicted) == _json(_stored_predicted(led, row.id)) == json.loads(json.dumps(stored))
    assert got.predicted.raw == ({"compute": 4.0}, 9.0, 70.0) and got.predicted.step_time_s == 10.0
    assert got.predicted.heaviest_stage == 0 and got.predicted.layer_pattern == "E" * 8
    assert got.prediction is not None and got.prediction.memory_by_stage == (60.0, 55.0)
    other = led.candidate_by_key("s1", "bare")
    assert other is not None and other.predicted.raw is None and other.prediction is None
    assert other.predicted.step_time_s == 0.0 and other.predicted.probe_step_s is None


def _stored_predicted(led: Ledger, cid: int):
    with led.store.read() as s:
        return s.execute(text("SELECT predicted FROM candidate WHERE id = :i"), {"i": cid}).scalar_one()
