"""The sweep's past, read from the ledger: a read-only floor under the driver (issue 46 item 2).

The driver (orchestrator/sweep), `status` and the report read what a sweep did from here, never from each
other: observations and the keys already tried (`observations`), what it spent (`spend`), the warm start's
seed (`seeds`), the GPUs' stated capacity (`capacity`), the candidates the early cut stopped (`cuts`) and the
live view's counts (`counts`). It reads the ledger, core and the search's types; it imports nothing of the
driver, the schedule or the launchers, and writes nothing (tests/house/test_design.py).
"""

from __future__ import annotations

from orchestrator.history.capacity import Capacity, capacity_view, effective_config, effective_hardware, measured
from orchestrator.history.counts import status_counts
from orchestrator.history.cuts import cut_candidates
from orchestrator.history.observations import (
    ProbeProvenance,
    best_of,
    best_step_s,
    fastest_at_scale_s,
    known_keys,
    observations,
    probe_margin,
    probe_provenance,
    provenance_of,
    rejected_keys,
    settled,
    stage_peaks,
    step_cv,
)
from orchestrator.history.seeds import seed, seedless
from orchestrator.history.spend import Spent, attempt_cost, fidelity_split, finalist_gpu_hours, spent, uses_a_run

__all__ = [
    "Capacity",
    "ProbeProvenance",
    "Spent",
    "attempt_cost",
    "best_of",
    "best_step_s",
    "capacity_view",
    "cut_candidates",
    "effective_config",
    "effective_hardware",
    "fastest_at_scale_s",
    "fidelity_split",
    "finalist_gpu_hours",
    "known_keys",
    "measured",
    "observations",
    "probe_margin",
    "probe_provenance",
    "provenance_of",
    "rejected_keys",
    "seed",
    "seedless",
    "settled",
    "spent",
    "stage_peaks",
    "status_counts",
    "step_cv",
    "uses_a_run",
]
