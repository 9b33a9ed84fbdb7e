"""Step `budget`: the round's proposals kept in order while its slots and the GPU-hours left (less the
confirmations') last."""

from __future__ import annotations

from orchestrator.core.states import Fidelity
from orchestrator.schedule.registry import Step, register
from orchestrator.schedule.round import Round
from orchestrator.search.types import Proposal


def within_budget(props: list[Proposal], slots: int, gpu_hours_left: float) -> list[Proposal]:
    """Keep proposals in order while runs and (estimated) GPU-hours last. A rank probe takes no slot: it
    uses no run (history.uses_a_run), only its few one-GPU hours."""
    out: list[Proposal] = []
    spent, runs = 0.0, 0
    for p in props:
        probe = p.fidelity == Fidelity.PROBE
        if not probe and runs >= slots:
            continue
        if spent + p.est_gpu_hours > gpu_hours_left:
            continue
        out.append(p)
        spent += p.est_gpu_hours
        runs += 0 if probe else 1
    return out


def run(r: Round) -> None:
    left = r.inp.gpu_hours_left - sum(c.est_gpu_hours for c in r.confirms)
    r.props = within_budget(r.props, r.size, left)


STEP = register(Step("budget", run))
