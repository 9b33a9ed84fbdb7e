"""Predicting from the nearest measurement (issue 48 items 1-3, schedule/steps/sibling_probes.py): a layout one
recompute change from a layout that ran at scale is estimated from it (orchestrator/search/nearest.py); where the
absolute model disputes that estimate and it beats the best, the layout is rank-probed, then measured at scale,
and the sweep does not converge while it is unmeasured."""

from __future__ import annotations

import pytest

from orchestrator.config import compose
from orchestrator.core.states import EventKind, Fidelity
from orchestrator.search.select import changed_knob
from tests.bench import searchlib as lib

# Only the searcher's proposals and this step probe: no fit, spread or coverage probe reaches the layout first.
STEPS = "[confirm,propose,screen,probe_first,sibling_probes,warm_start,early_cut,budget]"


@pytest.mark.long
def test_a_recompute_sibling_is_predicted_from_it_probed_measured_and_holds_convergence(tmp_path):
    # twin:sibling (light recompute over-charged 5-10x by the planner, and slower by 8-16% of a block's forward);
    # on seed 102 the step model predicts the moe_act layout 4% slower than its measured sibling says
    target = lib.Target("twin:sibling", seed=102)
    over = ["+stage=1k", "cluster=local", *target.overrides(), "stage.budget.startup_s=300"]
    # the searcher and the cut as they were when the case was found: its path (not the step's rule) decides whether
    # the moe_act layout's sibling is measured at scale first; today's defaults (a 0.08 loss, 1k's cut after 10
    # iterations) take another path on this seed
    pinned = ["policy.search.max_predicted_loss=0.15", "stage.screen.cut_after=15"]
    composed = compose([*over, f"policy.schedule.steps={STEPS}", *pinned])
    cfg = composed.cfg
    led = lib.fresh_ledger(str(tmp_path))
    lib.run_sweep(led, composed, target, "sib", startup_s=300.0)
    with led:
        cands = {c.key: c for c in led.candidates("sib")}
        by_prefix = {k[:10]: c for k, c in cands.items()}
        probed = [c for c in cands.values() if any(a.fidelity == Fidelity.PROBE for a in led.attempts(c.id))]
        sib = [c for c in probed if "sibling" in (c.decision.kind, (c.decision.previous or c.decision).kind)]
        assert sib, [c.decision.move for c in probed]
        # measured at scale for its sibling estimate (the step's own launch, kind "sibling"), after a rank probe
        measured = [c for c in sib if c.decision.kind == "sibling" and len(led.attempts(c.id)) > 1]
        assert measured, [c.decision.move for c in sib]
        c = measured[0]
        probe, *later = led.attempts(c.id)
        assert probe.fidelity == Fidelity.PROBE and later[-1].fidelity in (Fidelity.FULL, Fidelity.SCREEN)
        assert led.evidence.result(later[-1].id)["step_p50_s"] > 0
        # predicted from its measured sibling, one recompute change away, measured at scale before it; the
        # absolute model disputes the estimate (there: its step, more than converge_gain apart)
        why = c.decision.move
        assert "recompute differs" in why and "the absolute model" in why
        neighbour = by_prefix[why.split("from ", 1)[1][:10]]
        assert changed_knob(neighbour.layout, c.layout) == "recompute"
        ran = [a for a in led.attempts(neighbour.id) if a.fidelity != Fidelity.PROBE]
        assert ran and ran[-1].end_time <= later[-1].start_time  # measured at scale first
        # the convergence guard: the round that launched it at scale was held for it (Round.held): a sweep
        # whose stale rounds said "converged" there would have gone on to measure it, not stopped
        rounds = [e.data for e in led.events("sib", kind=EventKind.ROUND) if e.data and "held" in e.data]
        launched = [d for d in rounds if c.key in d["confirms"]]
        assert launched and all(any(h.startswith(c.layout.short()) for h in d["held"]) for d in launched)
        # and once measured, it holds nothing
        assert not any(c.layout.short() in h for d in rounds if d["round"] > launched[-1]["round"] for h in d["held"])
        assert cfg.policy.schedule.sibling_probes.knobs == ["recompute"]
