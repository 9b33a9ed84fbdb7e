"""The whole sweep's price as a sweep stores it (sweep/price.py simulates it; `status` and the report read it
back from the sweep's provenance): a typed record below both, so the report needs nothing of the driver."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


def gpu_hours_text(x: float) -> str:
    """GPU-hours as the lines print them: whole hours, or two figures for a sweep of a few."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


_gh = gpu_hours_text


@dataclass(frozen=True)
class SweepPrice:
    """The whole sweep's simulated price: mean GPU-hours, its 90% range, mean hours to the decision."""

    gpu_hours: float
    lo: float
    hi: float
    cluster_hours: float  # the stage's cluster, full-scale jobs one after another (core/cost.decision_hours)
    samples: tuple[float, ...]  # each simulated sweep's GPU-hours
    gpus: int

    def line(self) -> str:
        if not self.samples:
            return (
                "whole sweep (simulated): on no surface drawn from the planner's predictions and error bands did a "
                "layout run at scale; no price"
            )
        return (
            f"whole sweep (simulated: the policy run on {len(self.samples)} surfaces drawn from the planner's "
            f"predictions and error bands): expected total {_gh(self.gpu_hours)} GPU-h "
            f"(90%: {_gh(self.lo)}-{_gh(self.hi)}), {self.cluster_hours:,.1f} cluster-hours on {self.gpus:,} GPUs"
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"samples": list(self.samples)}

    @classmethod
    def from_dict(cls, d: dict) -> SweepPrice:
        return cls(**{**d, "samples": tuple(d.get("samples", ()))})

    def against(self, spent: float) -> str:
        """Spend so far against the range, for `status` and the report."""
        where = "under the range" if spent < self.lo else "over the range" if spent > self.hi else "inside the range"
        return (
            f"price: spent {_gh(spent)} GPU-h of an expected {_gh(self.gpu_hours)} "
            f"(90%: {_gh(self.lo)}-{_gh(self.hi)}, simulated): {spent / self.gpu_hours:.0%} of expected, {where}"
        )


def against(provenance: dict | None, spent: float) -> str | None:
    """`status`'s and the report's line: spend so far against the price a sweep stored in its provenance at
    its start (None: it stored none, as a sweep started before the price or with --price-samples 0)."""
    stored = (provenance or {}).get("price")
    if not stored or not stored.get("samples"):
        return None
    return SweepPrice.from_dict(stored).against(spent)
