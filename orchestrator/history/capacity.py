"""What the GPUs hold, from the evidence: a job's own statement of its GPU's capacity overrides hardware.hbm_gb.

Why: the planner's feasibility, calibration's HBM, the fit probes' band and the observations the search sees
all compare memory with `hardware.hbm_gb`. On a cluster whose GPUs hold less than the hardware group says,
every layout planned into the difference OOMs; yet each OOM message states the capacity ("GPU 0 has a total
capacity of 96.00 GiB"), and a real job's sidecar records torch's `total_memory`. So once any attempt of a
sweep stated it (orchestrator.evidence.metrics.gpu_capacity -> JobResult.gpu_capacity_gb -> the attempt's
ledger column), every later decision of that sweep plans with the smallest stated capacity, in either
direction, and the sweep says so once, naming the config to fix (a `capacity` event; `status` shows it).

Read from the ledger each time it is asked, never from memory, so a resumed sweep plans as the killed one did
(read-only, orchestrator/history/: the driver's orchestrator/sweep/capacity.py records the `capacity` event).
Units: the message's GiB are binary (2**30 bytes), hbm_gb decimal (1e9); the conversion is exact and only a
difference larger than the message's rounding (two decimals of GiB, <= 0.0054 GB) counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from orchestrator.core.schema import HardwareConfig, RootConfig
from orchestrator.ledger.ledger import Ledger

TOLERANCE_GB = 0.05  # below this the evidence agrees with the config (message rounding, a 0.1 GB config value)
GIB = 2**30


@dataclass(frozen=True)
class Capacity:
    """The smallest capacity the sweep's evidence stated, and where it came from."""

    gb: float  # decimal GB
    configured_gb: float  # hardware.hbm_gb of the sweep's config
    job_id: str | None
    attempt_id: int
    source: str  # "OOM message" | "device properties"

    @property
    def gib(self) -> float:
        return self.gb * 1e9 / GIB

    @property
    def overrides(self) -> bool:
        """The evidence disagrees with the config by more than rounding: the sweep plans with `gb`."""
        return abs(self.gb - self.configured_gb) > TOLERANCE_GB

    def warning(self) -> str:
        """The one line (under 200 characters: a log's line) that says what the sweep now plans with, and which
        config to fix."""
        return (
            f"warning: GPUs hold {self.gb:.1f} GB ({self.gib:.2f} GiB, job {self.job_id or '?'}'s "
            f"{self.source or 'evidence'}), not hardware.hbm_gb={self.configured_gb:g}: planning with "
            f"{self.gb:.1f} GB from now; set hardware.hbm_gb={self.gb:.1f} or pick the right hardware group"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "gib": self.gib, "overrides": self.overrides}


def measured(ledger: Ledger, sweep: str, hw: HardwareConfig) -> Capacity | None:
    """The smallest GPU capacity any attempt of `sweep` stated (the first attempt that stated it), or None."""
    rows = ledger.evidence.gpu_capacities(sweep)
    if not rows:
        return None
    low = min(rows, key=lambda r: (r.gb, r.attempt_id))
    return Capacity(low.gb, float(hw.hbm_gb), low.job_id, low.attempt_id, low.source)


def effective_hardware(ledger: Ledger, sweep: str, hw: HardwareConfig) -> HardwareConfig:
    """`hw` with hbm_gb replaced by the measured capacity when the evidence disagrees with it."""
    cap = measured(ledger, sweep, hw)
    return dataclasses.replace(hw, hbm_gb=cap.gb) if cap is not None and cap.overrides else hw


def effective_config(ledger: Ledger, cfg: RootConfig, sweep: str) -> RootConfig:
    """The sweep's config with the measured capacity as hardware.hbm_gb (for what plans outside the rounds)."""
    hw = effective_hardware(ledger, sweep, cfg.hardware)
    return cfg if hw is cfg.hardware else dataclasses.replace(cfg, hardware=hw)


def capacity_view(ledger: Ledger, sweep: str, hw: HardwareConfig) -> dict[str, Any] | None:
    """For `status`: the measured capacity and whether the sweep plans with it (None: nothing stated it)."""
    cap = measured(ledger, sweep, hw)
    return None if cap is None else {**cap.to_dict(), "line": cap.warning() if cap.overrides else ""}
