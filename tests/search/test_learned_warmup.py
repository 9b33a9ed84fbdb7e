"""The learned warm-up (schedule/fidelity.learned_warmup, steps/warm_start.warm): evidence beats configuration. How
long a warm-started launch takes to settle (compile, allocator, NCCL set-up) is measured by the sweep's own warm
launches
(their settled_iters), and later warm launches warm up that, with a margin, instead of the configured figure."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.config import compose
from orchestrator.core.decision import Decision
from orchestrator.core.states import Fidelity
from orchestrator.plan.layout import Layout
from orchestrator.schedule import fidelity
from orchestrator.schedule.steps.warm_start import warm
from orchestrator.search.env import PlanEnv
from orchestrator.search.types import Proposal


@cache
def _stage():
    return compose(["+stage=1k", "cluster=local", "stage.warm_start.learn=true"]).cfg.stage


@pytest.fixture(scope="module")
def stage():
    return _stage()


def test_the_warm_up_is_learned_once_enough_warm_launches_measured_it(stage):
    # on by default (kept where the held-out figures improved: docs/search-log.md), off with learn=false
    assert compose(["+stage=1k", "cluster=local"]).cfg.stage.warm_start.learn is True
    assert fidelity.learned_warmup(compose(["+stage=1k", "stage.warm_start.learn=false"]).cfg.stage, (3, 4)) is None
    ws = stage.warm_start
    assert (ws.learn, ws.learn_after, ws.learn_factor, ws.learn_floor, ws.warmup_iters) == (True, 2, 2.0, 5, 50)
    assert fidelity.learned_warmup(stage, ()) is None
    assert fidelity.learned_warmup(stage, (4,)) is None  # one launch is not yet evidence enough
    assert fidelity.learned_warmup(stage, (3, 4)) == 8  # twice the most any needed
    assert fidelity.learned_warmup(stage, (0, 1)) == 5  # at least the floor
    assert fidelity.learned_warmup(stage, (2, 40)) == 50  # never more than configured
    off = replace(stage, warm_start=replace(ws, learn=False))
    assert fidelity.learned_warmup(off, (3, 4)) is None
    short = replace(stage, warm_start=replace(ws, warmup_iters=3))  # a configured warm-up under the floor holds
    assert fidelity.learned_warmup(short, (0, 0)) == 3


@settings(deadline=None)  # speed stays out of assertions: the first call paid 2.6 s of imports on a loaded box
@given(st.lists(st.integers(0, 400), min_size=2, max_size=30), st.integers(0, 400))
def test_the_learned_warm_up_stays_in_its_bounds_and_grows_with_the_evidence(settled, more):
    stage = _stage()
    ws = stage.warm_start
    w = fidelity.learned_warmup(stage, settled)
    assert w is not None and min(ws.learn_floor, ws.warmup_iters) <= w <= ws.warmup_iters
    assert fidelity.learned_warmup(stage, [*settled, more]) >= w  # a launch that took longer never shortens it


def test_a_warm_decision_runs_its_learned_warm_up_and_a_cold_one_its_own(stage):
    warm = {"fidelity": "full", "warm_from": "/seed", "warmup_iters": 8}
    assert fidelity.decision_window(stage, Decision.from_dict(warm)) == (Fidelity.FULL, (8, stage.measure_iters))
    cold = {"fidelity": "full", "warmup_iters": 8}  # no seed loaded: routing still settles, the stage's warm-up
    assert fidelity.decision_window(stage, Decision.from_dict(cold)) == (
        Fidelity.FULL,
        (stage.warmup_iters, stage.measure_iters),
    )
    longer = {**warm, "warmup_iters": 80}  # never longer than the configured warm start's
    assert fidelity.decision_window(stage, Decision.from_dict(longer))[1][0] == stage.warm_start.warmup_iters
    before = {"fidelity": "full", "warm_from": "/seed"}  # a decision of before learning: the configured one
    assert fidelity.decision_window(stage, Decision.from_dict(before))[1][0] == stage.warm_start.warmup_iters


def test_the_schedule_gives_warm_launches_the_learned_warm_up_and_charges_it(stage):
    cfg = compose(["+stage=1k", "cluster=local", "stage.warm_start.learn=true"]).cfg
    env = PlanEnv(cfg.model, cfg.hardware, cfg.stage, cfg.workload.name)

    def props():
        pred = {"step_time_s": 60.0}
        return [
            Proposal(key="full", layout=Layout(), predicted=pred, reason="model-top"),
            Proposal(key="probe", layout=Layout(), predicted=pred, reason="model-top", fidelity=Fidelity.PROBE),
        ]

    configured, learned = props(), props()
    warm(env, configured, "/seed")
    warm(env, learned, "/seed", 8)
    assert configured[0].warmup_iters is None and "warmup_iters" not in configured[0].decision().to_dict()
    assert learned[0].decision().warmup_iters == 8
    assert fidelity.decision_window(stage, learned[0].decision())[1] == (8, stage.measure_iters)
    saved = (stage.warm_start.warmup_iters - 8) * 60.0 * stage.gpus / 3600
    assert configured[0].est_gpu_hours - learned[0].est_gpu_hours == pytest.approx(saved)
    assert learned[1].warmup_iters is None  # a rank probe neither loads the seed nor learns its warm-up
    # before a seed: the round's first full launch saves it and runs cold; the others wait for it, then load it
    first = props() + props()
    warm(env, first, None, 8)
    saver, _, waiter, _ = first
    assert saver.seed_save and saver.warmup_iters is None
    assert waiter.after_seed and waiter.decision().warmup_iters == 8
