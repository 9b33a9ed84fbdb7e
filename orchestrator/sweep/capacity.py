"""The planner environment each round of the driver plans with: the hardware group on the GPU capacity the
sweep's own jobs stated (orchestrator/history/capacity.py reads it), recorded once as a `capacity` event and
shown once (the driver's write; the history floor only reads)."""

from __future__ import annotations

import dataclasses

from orchestrator.core.states import EventKind
from orchestrator.history.capacity import measured
from orchestrator.ledger.ledger import Ledger
from orchestrator.search.env import PlanEnv


def plan_env(ledger: Ledger, sweep: str, env: PlanEnv, view=None) -> PlanEnv:
    """The planner environment the next decision uses: `env` on the measured capacity when the evidence
    disagrees with its hardware. The first time a capacity overrides, it is recorded (a `capacity` event) and
    the warning shown once."""
    cap = measured(ledger, sweep, env.hardware)
    if cap is None:
        return env
    if not cap.overrides:  # (an env already on the measured capacity agrees with it: unchanged)
        return env
    seen = {(e.data or {}).get("attempt_id") for e in ledger.events(sweep, kind=EventKind.CAPACITY)}
    if cap.attempt_id not in seen:
        ledger.log_event(sweep, EventKind.CAPACITY, cap.warning(), data=cap.to_dict())
        if view is not None:
            view.event(cap.warning())
    return dataclasses.replace(env, hardware=dataclasses.replace(env.hardware, hbm_gb=cap.gb))
