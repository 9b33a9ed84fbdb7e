"""The planner as the policy sees it: one (model, hardware, stage, workload), optional calibration.

A thin adapter over orchestrator.plan.planner so the policy speaks in Proposals and raw/calibrated
predictions, and so the cost estimate (GPU-hours) lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan import planner
from orchestrator.plan.layout import Layout
from orchestrator.policy.types import Proposal, prediction_dict
from orchestrator.schema import HardwareConfig, ModelConfig, StageConfig
from orchestrator.states import EdgeKind


@dataclass
class PlanEnv:
    model: ModelConfig
    hardware: HardwareConfig
    stage: StageConfig
    workload: str = "twin"

    def plan(self, factors: dict[str, float] | None = None, memory_factor: float = 1.0) -> list:
        """Feasible candidates (Planned), best predicted step time first."""
        res = planner.plan(
            self.model,
            self.hardware,
            self.stage,
            factors=factors or None,
            memory_factor=memory_factor,
            workload=self.workload,
        )
        return [c for c in res.candidates if c.prediction.feasible]

    def evaluate(self, layout: Layout, factors: dict[str, float] | None = None, memory_factor: float = 1.0):
        """Planned when legal and feasible under this calibration, else None."""
        out = planner.evaluate(
            self.model,
            self.hardware,
            self.stage,
            layout,
            factors=factors or None,
            memory_factor=memory_factor,
            workload=self.workload,
        )
        return out if isinstance(out, planner.Planned) and out.prediction.feasible else None

    def raw(self, layout: Layout) -> tuple[dict[str, float], float, float] | None:
        """(components, step_s, memory_gb) with no calibration, even for a layout over HBM (calibration
        learns from OOMs too, so the memory rule must not hide their components)."""
        out = planner.evaluate(
            self.model, self.hardware, self.stage, layout, workload=self.workload, check_memory=False
        )
        if not isinstance(out, planner.Planned):
            return None
        p = out.prediction
        return dict(p.step_components), p.step_time_s, p.memory_gb

    def gpu_hours(self, step_s: float) -> float:
        """N x step x (warmup + measured iterations) / 3600: what one run of this stage costs."""
        iters = self.stage.warmup_iters + self.stage.measure_iters
        return self.stage.gpus * step_s * iters / 3600.0

    def proposal(
        self,
        planned,
        *,
        reason: str,
        factors: dict[str, float] | None = None,
        memory_factor: float = 1.0,
        parent_key: str | None = None,
        edge_kind: EdgeKind | None = None,
        predicted_gain: float | None = None,
        uncertainty: float | None = None,
    ) -> Proposal:
        """A Proposal carrying the calibrated prediction plus the raw one calibration will need later."""
        comps, step, mem = self.raw(planned.layout) or (
            planned.prediction.step_components,
            planned.prediction.step_time_s,
            planned.prediction.memory_gb,
        )
        pred = prediction_dict(
            planned.prediction,
            raw_components=comps,
            raw_step_s=step,
            raw_memory_gb=mem,
            factors=factors,
            memory_factor=memory_factor,
        )
        return Proposal(
            key=planned.key,
            layout=planned.layout,
            predicted=pred,
            reason=reason,
            parent_key=parent_key,
            edge_kind=edge_kind,
            est_gpu_hours=self.gpu_hours(planned.prediction.step_time_s),
            predicted_gain=predicted_gain,
            uncertainty=uncertainty,
        )
