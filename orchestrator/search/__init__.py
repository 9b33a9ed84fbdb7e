"""Sweep policies: read ledger observations, calibrate the planner, propose the next round, promote.

Pluggable: conf/policy/<name>.yaml sets `name`, which selects a class from POLICIES.
"""

from __future__ import annotations

from orchestrator.core.errors import UserError
from orchestrator.core.schema import PolicyConfig


def _registry() -> dict[str, type]:
    from orchestrator.search.policies import CalibratedNeighbours, PredictedTopK

    return {cls.name: cls for cls in (CalibratedNeighbours, PredictedTopK)}


def make_policy(cfg: PolicyConfig):
    """The policy class named by cfg.name, constructed with cfg."""
    reg = _registry()
    if cfg.name not in reg:
        raise UserError(f"unknown policy '{cfg.name}': choose one of {', '.join(sorted(reg))} (policy.name=...)")
    return reg[cfg.name](cfg)


def policy_names():
    return sorted(_registry())
