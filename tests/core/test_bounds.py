"""Every numeric config field has a range, declared beside its default (orchestrator/core/bounds.py), and one
checker refuses a value outside it, naming the key, the value and the range."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from orchestrator.config import ConfigError, compose
from orchestrator.core import bounds
from orchestrator.core.schema import RootConfig, StageConfig


def _numeric(hint: typing.Any) -> bool:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is dict:  # knob -> value maps (parity.reference): the planner checks the knobs
        return False
    if typing.get_origin(hint) is list:
        return _numeric(args[0])
    if args:
        return any(_numeric(a) for a in args if a is not type(None))
    return hint in (int, float)


def _fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, typing.Any]]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        inner = [t for t in (typing.get_args(hint) or (hint,)) if dataclasses.is_dataclass(t)]
        if inner:
            out += _fields(inner[0], f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", f, hint))
    return out


def test_every_numeric_field_of_the_schema_declares_a_range():
    missing = [k for k, f, hint in _fields(RootConfig) if _numeric(hint) and bounds.range_of(f) is None]
    assert missing == [], f"declare these with bounds.ranged(default, lo, hi): {missing}"
    assert len([k for k, f, h in _fields(RootConfig) if bounds.range_of(f)]) > 100  # the walk saw the schema


def test_every_default_is_inside_its_own_range():
    assert bounds.violation(RootConfig(stage=StageConfig())) is None


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("stage.screen.resolution=0", "stage.screen.resolution=0.0", "> 0 and <= 1"),
        ("cluster.poll_interval_s=-1", "cluster.poll_interval_s=-1.0", "> 0"),
        ("stage.search.pp=[]", "stage.search.pp=[]", "a non-empty list, each value an integer >= 1"),
        ("stage.gpus=0", "stage.gpus=0", "an integer >= 1"),
        ("stage.gpus=-8", "stage.gpus=-8", "an integer >= 1"),
        ("stage.search.mbs=[0]", "stage.search.mbs=[0]", "an integer >= 1"),
        ("ledger.lease_ttl_s=nan", "ledger.lease_ttl_s=nan", "a finite number > 0"),
        ("ledger.lease_ttl_s=inf", "ledger.lease_ttl_s=inf", "a finite number > 0"),
        ("stage.warmup_iters=-1", "stage.warmup_iters=-1", "an integer >= 0"),
        ("stage.screen.warmup_iters=-10", "stage.screen.warmup_iters=-10", "an integer >= 0"),
        ("policy.schedule.screen_round_size=-1", "policy.schedule.screen_round_size=-1", "an integer >= 0"),
        ("stage.screen.confirm_per_round=-1", "stage.screen.confirm_per_round=-1", "an integer >= 0"),
        ("stage.budget.max_runs=0", "stage.budget.max_runs=0", "an integer >= 1"),
        ("stage.budget.max_gpu_hours=-5", "stage.budget.max_gpu_hours=-5.0", "a finite number > 0"),
        ("stage.budget.max_rounds=0", "stage.budget.max_rounds=0", "an integer >= 1"),
    ],
)
def test_a_value_out_of_range_is_refused_at_compose_naming_key_value_and_range(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        compose(["+stage=smoke", override])
    msg = str(err.value)
    assert msg.startswith(f"{key} is out of range: it must be ") and allowed in msg, msg


def test_a_range_admits_its_bounds_and_none_and_refuses_the_rest():
    r = bounds.Range(lo=0, hi=1, gt=True)
    assert r.admits(1) and r.admits(0.5) and r.admits(None)
    assert not r.admits(0) and not r.admits(1.01) and not r.admits(math.nan) and not r.admits(-math.inf)
    lists = bounds.Range(lo=1, nonempty=True)
    assert lists.admits([1, 2]) and lists.admits([[], ["moe_act"]]) and not lists.admits([]) and not lists.admits([0])
