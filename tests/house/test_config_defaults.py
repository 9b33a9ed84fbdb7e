"""Defaults live once, in the typed schema (orchestrator/core/schema.py); a YAML file under conf/ carries only
what differs. Every YAML is read as Hydra places it (its group, or the root for `# @package _global_`) and
each value is compared with the schema's default for the same key: a value equal to the default is a copy
that can drift (conf/policy/default.yaml once disagreed with the schema on two of its 16 fields).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config import CONF_DIR
from orchestrator.core.schema import RootConfig


def _dataclass_of(cls: type, name: str) -> type | None:
    """The dataclass type of field `name` of `cls` (through Optional), or None when it is not one."""
    hint = typing.get_type_hints(cls)[name]
    for t in typing.get_args(hint) or (hint,):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None


def _node(path: Path) -> tuple[type, str]:
    """The schema dataclass a YAML file fills, and its key path (what Hydra's package makes of it)."""
    rel = path.relative_to(CONF_DIR)
    if rel.parts == ("config.yaml",) or path.read_text().lstrip().startswith("# @package _global_"):
        return RootConfig, ""
    cls: type = RootConfig
    for group in rel.parts[:-1]:
        inner = _dataclass_of(cls, group)
        assert inner is not None, f"{rel}: conf/{group} is not a config group of the schema"
        cls = inner
    return cls, ".".join(rel.parts[:-1])


def _default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def restated(cls: type, data: dict, prefix: str) -> list[str]:
    """Keys of `data` whose value is the schema's default (nested groups compared field by field)."""
    out = []
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key == "defaults" or key not in names:  # a defaults list selects; an unknown key fails compose
            continue
        inner = _dataclass_of(cls, key)
        where = f"{prefix}.{key}" if prefix else key
        if inner is not None and isinstance(value, dict):
            out += restated(inner, value, where)
        elif isinstance(value, str) and "${" in value:
            continue  # an interpolation is resolved later, never a copy of a default
        elif value == _default(cls, key):
            out.append(f"{where} = {value!r}")
    return out


def test_the_check_finds_a_restated_default():
    from orchestrator.core.schema import PolicyConfig, StageConfig

    schedule = PolicyConfig().schedule
    data = {"schedule": {"round_size": schedule.round_size, "fit_probes": {"per_round": 9}}, "name": "other"}
    assert restated(PolicyConfig, data, "policy") == [f"policy.schedule.round_size = {schedule.round_size!r}"]
    stage = StageConfig()
    data = {"budget": {"max_runs": stage.budget.max_runs}, "search": {"tp": list(stage.search.tp)}, "gpus": 1}
    assert restated(RootConfig, {"stage": data}, "") == [
        f"stage.budget.max_runs = {stage.budget.max_runs!r}",
        f"stage.search.tp = {list(stage.search.tp)!r}",
    ]


DATA = {"published"}  # conf/published/: NVIDIA's measured rows (data `validate` reads), not a config group


def test_no_yaml_restates_a_schema_default():
    found = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        if path.relative_to(CONF_DIR).parts[0] in DATA:
            continue
        cls, prefix = _node(path)
        data = yaml.safe_load(path.read_text()) or {}
        found += [f"conf/{path.relative_to(CONF_DIR)}: {hit}" for hit in restated(cls, data, prefix)]
    assert not found, (
        "these YAML values restate orchestrator/core/schema.py's defaults; delete them (or change the schema's "
        "default, with its comment, if the YAML's value is the right one):\n" + "\n".join(found)
    )
