"""The schedule: the fidelity rungs (probe, screen, full), round sizes and the round's budget, apart from the
searchers (orchestrator/search/) that rank and propose layouts. Above search/, below sweep/ (which calls it).

Modules: rungs (`Schedule`: a round is the policy's steps in order), registry (name -> step), round (the round
the steps build, and the rungs several steps share), steps/ (one module per step), fidelity (each fidelity's
window, the screen's length from measured noise, the contenders a screen cannot separate from the best).
"""

from __future__ import annotations

from orchestrator.schedule.rungs import Schedule

__all__ = ["Schedule"]
