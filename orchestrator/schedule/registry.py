"""The schedule's step registry: each module under schedule/steps/ registers one `Step` as it is imported.

Why a registry (as launch/registry.py keeps the launcher backends): a round's schedule is an ordered list of
step names (policy.schedule.steps), each step one module with its own settings (policy.schedule.<name>, typed
in orchestrator/core/schema.py), so a new idea is one new module and one list entry, never another flag in one
function. `Schedule` (schedule/rungs.py) imports every module under steps/ before it reads the list (`load`);
this module holds only the record and the table, so a step can register without importing the schedule.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.core.errors import UserError

if TYPE_CHECKING:
    from orchestrator.schedule.round import Round


@dataclass(frozen=True)
class Step:
    """One step of a round's schedule, as its module registers it."""

    name: str  # its entry in policy.schedule.steps (its settings, if any: policy.schedule.<name>)
    run: Callable[[Round], None]  # what it does to the round being planned (schedule/round.Round)


STEPS_PACKAGE = "orchestrator.schedule.steps"
STEPS: dict[str, Step] = {}  # name -> Step; read through `steps`, which fills it
_loaded: list[str] = []  # the step modules imported (once per process)


def register(step: Step) -> Step:
    """Add `step` to the table (its module does, on import); a name is registered once."""
    taken = STEPS.get(step.name)
    if taken is not None and taken is not step:
        raise ValueError(f"schedule step {step.name!r} is registered twice")
    STEPS[step.name] = step
    return step


def load() -> dict[str, Step]:
    """name -> Step, after importing every module under orchestrator/schedule/steps/ (each registers itself)."""
    if not _loaded:
        package = importlib.import_module(STEPS_PACKAGE)  # by name: the steps import this room, not it them
        for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            importlib.import_module(info.name)
            _loaded.append(info.name)
    return STEPS


def steps(names: list[str]) -> list[Step]:
    """The steps `names` lists, in its order; a UserError naming the registered ones for an unknown name."""
    table = load()
    unknown = [n for n in names if n not in table]
    if unknown:
        raise UserError(f"policy.schedule.steps: unknown step {unknown[0]!r}: the steps are {', '.join(sorted(table))}")
    return [table[n] for n in names]
