"""What the analytic models predict for one legal layout: the planner's output, stored with each candidate
(candidate.predicted) and carried by its JobSpec.

In core (stdlib only) because it crosses every floor: the planner (orchestrator/plan) makes it, the ledger
stores it, the driver rebuilds a launch from it and the twin reads it. `from_stored` is the one decoding of a
stored prediction: the stored dict also carries what the search added beside the models' fields (the raw,
uncalibrated components, the calibration factors, `revived`), which it leaves out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Prediction:
    """What the analytic models say about one legal layout. All times in seconds, memory in GB (1e9)."""

    d_a: int
    d_e: int
    m: int
    bubble: float  # (p-1)/(m+p-1), or its interleaved form (p-1)/(v*m+p-1)
    t_group: int  # EP x b x S / CP unique tokens per dispatch
    t_expert: float  # k x T_group / E
    experts_per_rank: int  # E / EP per MoE layer
    ep_nodes: int  # nodes one EP group spans
    cp_nodes: int  # nodes one CP group spans
    routed_weight_gb: float  # routed expert weights on the heaviest stage
    heaviest_stage: int
    memory_gb: float  # heaviest rank's predicted peak
    memory_by_stage: tuple[float, ...]
    feasible: bool  # memory_gb + margin <= HBM
    step_time_s: float
    step_components: dict[str, float] = field(default_factory=dict)  # compute, a2a, cp, bubble, grad_sync ... seconds
    flops_per_step: float = 0.0  # model FLOPs (activated experts, V4 attention), recompute excluded
    recompute_flops_per_step: float = 0.0
    mfu: float = 0.0
    tokens_per_s: float = 0.0
    layer_pattern: str = ""  # HybridModel pattern with | stage boundaries
    # per PP rank, the raw (uncalibrated) memory terms (memory.TERMS -> GB): what per-term calibration fits
    memory_terms_by_stage: tuple[dict[str, float], ...] = ()
    # the compute-only step a one-GPU rank probe of the last rank measures (steptime.StepTime.probe_s), raw:
    # what orchestrator/search/compose.py divides a probe's measurement by
    probe_step_s: float = 0.0

    @classmethod
    def from_stored(cls, d: Mapping[str, Any] | None) -> Prediction | None:
        """A stored prediction (candidate.predicted, JobSpec.predicted) as the models' record: its fields only,
        sequences as tuples; None when it lacks one (a candidate added by another tool, an older shape)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in (d or {}).items() if k in names}
        for k in ("memory_by_stage", "memory_terms_by_stage"):
            if k in kw:
                kw[k] = tuple(kw[k] or ())
        try:
            return cls(**kw)
        except TypeError:  # a required field missing
            return None
