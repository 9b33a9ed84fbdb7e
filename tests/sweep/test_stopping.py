"""stage.budget.converge_rounds: the driver (orchestrator/sweep/decide.py) stops a sweep at the first round
after which the stage's own number of rounds in a row brought no gain > policy.search.converge_gain nor a near-tie
within it, and nothing of those rounds waits for a launch; not before.
Run on the real decision loop and ledger of the bench harness (tests/bench/searchlib.py) on the twin."""

from __future__ import annotations

import math

import pytest

from orchestrator.config import ConfigError, compose, root_from_yaml
from orchestrator.core.states import Fidelity
from tests.bench import searchlib as lib


def _stale_after(best_by_round: list[float], fastest_by_round: list[float], gain: float) -> list[int]:
    """For each round, the rounds in a row up to it without a gain > `gain` over the best before them, nor a
    near-tie: a full-window measurement of the round within `gain` of that best (Policy.stale_rounds)."""
    out, streak = [], 0
    for i, cur in enumerate(best_by_round):
        prev = best_by_round[i - 1] if i else math.inf
        near = fastest_by_round[i] <= prev * (1.0 + gain)
        streak = 0 if prev == math.inf or cur < prev * (1.0 - gain) or near else streak + 1
        out.append(streak)
    return out


@pytest.mark.long
@pytest.mark.parametrize("rounds", [1, 2])
def test_a_sweep_stops_at_the_first_round_its_stage_calls_converged(tmp_path, rounds):
    target = lib.Target("twin:balanced")
    composed = compose(
        ["+stage=1k", "cluster=local", *target.overrides(), "stage.budget.startup_s=300"]
        + [f"stage.budget.converge_rounds={rounds}", "stage.budget.max_rounds=8", "stage.budget.max_runs=200"]
    )
    led = lib.fresh_ledger(str(tmp_path))
    with led:
        run = lib.run_sweep(led, composed, target, "stop", startup_s=300.0)
    assert run.reason.startswith("converged"), run.reason
    assert f"for {rounds} round" in run.reason
    last = max(x[0] for x in run.launches)
    best, best_by_round, fastest_by_round = math.inf, [], []
    for rnd in range(last + 1):  # a confirmation counts for its candidate's round, as the policy reads it
        full = [x[3] for x in run.launches if x[0] == rnd and x[5] == Fidelity.FULL and x[3] is not None]
        best = min([best, *full])
        best_by_round.append(best)
        fastest_by_round.append(min(full, default=math.inf))
    stale = _stale_after(best_by_round, fastest_by_round, composed.cfg.policy.search.converge_gain)
    assert stale[-1] >= rounds  # the stop: the stage's rounds without a gain ...
    # ... reached only at the last round planned, or at a round whose stop waited: a confirmation or a probe
    # that passed, of that round or one before it, launched in a later decision batch (Schedule.waiting)
    first_batch = {rnd: min(x[6] for x in run.launches if x[0] == rnd) for rnd in range(last + 1)}

    def waited(rnd: int) -> bool:
        return any(x[0] <= rnd and x[6] > first_batch[rnd] for x in run.launches)

    assert all(s < rounds or waited(rnd) for rnd, s in enumerate(stale[:-1]))
    assert not waited(last)  # the stop itself waited for nothing


@pytest.mark.long
def test_a_sweep_stored_before_the_rule_moved_resumes_with_its_own_rounds():
    """policy.converge_rounds moved to stage.budget.converge_rounds: a stored snapshot from before (resume,
    promotion, the report) keeps the rounds it was created with; an override of the old key names the new."""
    import yaml

    snapshot = yaml.safe_load(compose(["+stage=1k"]).to_yaml())
    assert snapshot["stage"]["budget"].pop("converge_rounds") == 2  # conf/stage/1k.yaml
    snapshot["policy"]["converge_rounds"] = 4  # as it was stored then
    back = root_from_yaml(yaml.safe_dump(snapshot))
    assert back.stage.budget.converge_rounds == 4
    snapshot["stage"]["budget"]["converge_rounds"] = 3  # the new key, where both are: the new one wins
    assert root_from_yaml(yaml.safe_dump(snapshot)).stage.budget.converge_rounds == 3
    with pytest.raises(ConfigError, match=r"policy.converge_rounds.*it moved: stage.budget.converge_rounds$"):
        compose(["+stage=1k", "policy.converge_rounds=3"])


def test_every_moved_key_is_told_where_it_went_and_its_stored_value_loads_there():
    """One table of moved keys (schema.MOVED_KEYS) serves both: an override of an old key (or of a key below it)
    names the new one, and a stored snapshot holding the old key loads its value at the new one, making the
    groups on the way; a snapshot that also holds the new key keeps the new one."""
    import copy

    import yaml

    from orchestrator.config import nearest_key
    from orchestrator.core.schema import (
        MOVED_KEYS,
        MOVED_TO_LIST,
        SCHEDULE_STEPS,
        STEP_SWITCHES,
        legacy_moved,
        moved_to,
    )

    base = yaml.safe_load(compose(["+stage=1k"]).to_yaml())
    for old, new in MOVED_KEYS.items():
        assert nearest_key(old) == f"; it moved: {new}" and moved_to(f"{old}.x") == f"{new}.x"
        if old in STEP_SWITCHES:  # an on/off switch that became a step: off leaves the step out, on keeps the list
            *path, key = old.split(".")
            for on, steps in ((False, [s for s in SCHEDULE_STEPS if s != STEP_SWITCHES[old]]), (True, None)):
                snap = copy.deepcopy(base)
                snap[path[0]]["schedule"].pop("steps")
                snap[path[0]][key] = on
                back = legacy_moved(snap)
                assert key not in back[path[0]] and back[path[0]]["schedule"].get("steps") == steps, (old, on)
            continue
        *path, key = old.split(".")
        snap = copy.deepcopy(base)
        *new_path, new_key = new.split(".")
        if new.startswith(f"{old.rsplit('.', 1)[0]}."):  # moved into a group below: a snapshot from before lacks it
            snap[path[0]].pop(new_path[1], None)
        else:  # moved elsewhere: a snapshot from before lacks the new key
            holder = snap
            for part in new_path:
                holder = holder[part]
            holder.pop(new_key)
        node = snap
        for part in path:
            node = node[part]
        node[key] = "stored"
        back = legacy_moved(snap)
        node = back
        for part in new.split("."):
            node = node[part]
        assert node == (["stored"] if new in MOVED_TO_LIST else "stored"), (old, new)  # a list holds the old value
    assert moved_to("cluster.folder") is None and moved_to("policy.name") is None
