"""What the analytic models predict for one legal layout: the planner's output, stored with each candidate
(candidate.predicted) and carried by its JobSpec.

In core (stdlib only) because it crosses every floor: the planner (orchestrator/plan) makes it, the ledger
stores it, the driver rebuilds a launch from it and the twin reads it. `from_stored` is the one decoding of a
stored prediction: the stored dict also carries what the search added beside the models' fields (the raw,
uncalibrated components, the calibration factors, `revived`), which it leaves out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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


class Predicted(Mapping[str, Any]):
    """A candidate's stored prediction as the ledger hands it out (CandidateRow.predicted, MeasuredRow.predicted):
    read-only, the stored dict unchanged (the models' fields and what the search added beside them: the raw,
    uncalibrated numbers calibration fits, its factors, `revived`), with the figures the driver and the history
    read as typed properties and `models` the models' record, decoded once."""

    __slots__ = ("_d",)

    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        self._d = dict(stored or {})

    def __getitem__(self, name: str) -> Any:
        return self._d[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        return f"Predicted(step_time_s={self.step_time_s}, memory_gb={self._d.get('memory_gb')})"

    @property
    def models(self) -> Prediction | None:
        """The models' record (None for a candidate added by another tool or an older shape)."""
        return Prediction.from_stored(self._d)

    @property
    def step_time_s(self) -> float:
        """The predicted step (calibrated when the search stored it so); 0.0 when none was stored."""
        return float(self._d.get("step_time_s") or 0.0)

    @property
    def heaviest_stage(self) -> int | None:
        v = self._d.get("heaviest_stage")
        return None if v is None else int(v)

    @property
    def layer_pattern(self) -> str:
        return str(self._d.get("layer_pattern") or "")

    @property
    def probe_step_s(self) -> float | None:
        """The raw compute-only step of the rank a probe times (Prediction.probe_step_s); None when not stored."""
        v = self._d.get("probe_step_s")
        return float(v) if v else None

    @property
    def memory_terms_by_stage(self) -> tuple[dict[str, float], ...]:
        return tuple(dict(t) for t in self._d.get("memory_terms_by_stage") or ())

    @property
    def raw(self) -> tuple[dict[str, float], float, float] | None:
        """(components, step, memory) before calibration, as the search stored them (search/types.prediction_dict);
        None for a candidate that carries none (run-one, plan --save)."""
        d = self._d
        if "raw_components" in d and d.get("raw_step_time_s") and d.get("raw_memory_gb"):
            return dict(d["raw_components"]), float(d["raw_step_time_s"]), float(d["raw_memory_gb"])
        return None

    @property
    def revived(self) -> bool:
        """Pruned by the uncalibrated memory model, fits the calibrated one (search/env)."""
        return "revived" in self._d
