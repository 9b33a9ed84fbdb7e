"""The planner as the policy sees it: one (model, hardware, stage, workload), optional calibration.

A thin adapter over orchestrator.plan.planner so the policy speaks in Proposals and raw/calibrated
predictions, and so the cost estimate (GPU-hours) lives in one place.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from orchestrator.core import cost
from orchestrator.core.schema import HardwareConfig, ModelConfig, RecipeConfig, StageConfig
from orchestrator.core.states import EdgeKind
from orchestrator.plan import planner
from orchestrator.plan.layout import Layout
from orchestrator.plan.memory import MemoryScale
from orchestrator.search.types import Proposal, prediction_dict

PLANS_KEPT = 4  # whole-stage plans a PlanEnv keeps (each thousands of Planned)


@dataclass
class PlanEnv:
    model: ModelConfig
    hardware: HardwareConfig
    stage: StageConfig
    workload: str = "twin"
    # the workload's training recipe (None: its defaults): its overlaps and declared numerics (the optimizer
    # precisions the search may choose) are the planner's
    recipe: RecipeConfig | None = None
    # the last few whole-stage plans by calibration: a round asks for the same one up to four times (propose,
    # the evidence's revivals, fit and coverage probes), each a walk of every layout; a new env starts empty
    _plans: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False, compare=False)
    # (hardware, its copy without the HBM rule) for legal(): one copy, so its plans are shared too
    _unbounded: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def _stage_plan(self, hardware: HardwareConfig, factors: dict[str, float] | None, memory_factor: MemoryScale):
        """planner.plan's candidates under this calibration, shared by the calls that ask for the same one (the
        planner is deterministic in its inputs; callers get their own list, the Planned are never changed)."""
        key = (
            *(id(x) for x in (self.model, hardware, self.stage, self.recipe)),
            self.workload,
            repr(sorted((factors or {}).items())),
            repr(sorted(memory_factor.items())) if isinstance(memory_factor, Mapping) else repr(memory_factor),
        )
        hit = self._plans.get(key)
        if hit is None:
            res = planner.plan(
                self.model,
                hardware,
                self.stage,
                factors=factors or None,
                memory_factor=memory_factor,
                workload=self.workload,
                recipe=self.recipe,
            )
            # the inputs kept alive with it, so no other object takes their ids while it is kept
            hit = self._plans[key] = ((self.model, hardware, self.stage, self.recipe), tuple(res.candidates))
            while len(self._plans) > PLANS_KEPT:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return hit[1]

    def plan(self, factors: dict[str, float] | None = None, memory_factor: MemoryScale = 1.0) -> list:
        """Feasible candidates (Planned), best predicted step time first."""
        return [c for c in self._stage_plan(self.hardware, factors, memory_factor) if c.prediction.feasible]

    def plan_with_evidence(
        self,
        factors: dict[str, float] | None,
        memory_factor: MemoryScale,
        known_fit: Callable[[Layout], bool],
    ) -> list:
        """`plan`, plus every legal layout the memory model prunes that evidence says fits (`known_fit`: it needs
        no more memory than a layout that ran, select.fit_dominated): evidence beats the model. Best first."""
        base = self.plan(factors, memory_factor)
        keys = {c.key for c in base}
        extra = []
        for c in self.legal(factors):
            if known_fit(c.layout):
                cal = self.evaluate_unchecked(c.layout, factors, memory_factor)
                if cal is not None and cal.key not in keys:
                    extra.append(cal)
        if not extra:
            return base
        return sorted(base + extra, key=lambda p: (p.prediction.step_time_s, p.prediction.memory_gb))

    def evaluate(self, layout: Layout, factors: dict[str, float] | None = None, memory_factor: MemoryScale = 1.0):
        """Planned when legal and feasible under this calibration, else None."""
        out = self._planned(layout, factors, memory_factor, check_memory=True)
        return out if out is not None and out.prediction.feasible else None

    def _planned(self, layout: Layout, factors: dict[str, float] | None, memory_factor: MemoryScale, *, check_memory):
        """The planner's verdict on one layout under this calibration: Planned, or None when a rule rejects it
        (`check_memory=False`: the HBM rule is not applied, prediction.feasible still says whether it fits)."""
        out = planner.evaluate(
            self.model,
            self.hardware,
            self.stage,
            layout,
            factors=factors or None,
            memory_factor=memory_factor,
            workload=self.workload,
            recipe=self.recipe,
            check_memory=check_memory,
        )
        return out if isinstance(out, planner.Planned) else None

    def raw(self, layout: Layout) -> tuple[dict[str, float], float, float] | None:
        """(components, step_s, memory_gb) with no calibration, even for a layout over HBM (calibration
        learns from OOMs too, so the memory rule must not hide their components)."""
        out = self._planned(layout, None, 1.0, check_memory=False)
        if out is None:
            return None
        p = out.prediction
        return dict(p.step_components), p.step_time_s, p.memory_gb

    def raw_probe_s(self, layout: Layout) -> float | None:
        """The planner's uncalibrated compute-only step of the rank a rank probe times (Prediction.probe_step_s)."""
        out = self._planned(layout, None, 1.0, check_memory=False)
        return out.prediction.probe_step_s or None if out is not None else None

    def raw_memory_terms(self, layout: Layout) -> tuple[dict[str, float], ...]:
        """The planner's uncalibrated memory terms per PP stage (memory.TERMS -> GB); () when illegal."""
        out = self._planned(layout, None, 1.0, check_memory=False)
        return tuple(out.prediction.memory_terms_by_stage) if out is not None else ()

    def fits(self, memory_gb: float) -> bool:
        """The planner's memory rule: heaviest rank + stage margin <= HBM."""
        return memory_gb + self.stage.memory_margin_gb <= self.hardware.hbm_gb

    def revived(self, raw_memory_gb: float, calibrated_memory_gb: float) -> bool:
        """The uncalibrated model prunes this layout (round 0 never saw it) but the calibrated one keeps it."""
        return not self.fits(raw_memory_gb) and self.fits(calibrated_memory_gb)

    def legal(self, factors: dict[str, float] | None = None) -> list:
        """Every legal layout whatever its memory (the HBM rule not applied), its step under `factors` and its
        memory uncalibrated; best predicted step first."""
        if self._unbounded is None or self._unbounded[0] is not self.hardware:
            self._unbounded = (self.hardware, dataclasses.replace(self.hardware, hbm_gb=float("inf")))
        return list(self._stage_plan(self._unbounded[1], factors, 1.0))

    def memory_band(self, fit, factors: dict[str, float] | None = None) -> list:
        """Legal layouts whose heaviest stage the calibrated model cannot place on either side of HBM
        (calibrate.within_band): neither surely fits nor surely OOMs. Each Planned carries its calibrated
        prediction (feasible or not); best predicted step first. A fit probe, not the model, decides them."""
        from orchestrator.search.calibrate import memory_estimate, within_band

        out = []
        for c in self.legal(factors):
            est = memory_estimate(fit, c.prediction.memory_terms_by_stage, c.layout.recompute)
            if within_band(est, hbm_gb=self.hardware.hbm_gb, margin_gb=self.stage.memory_margin_gb):
                mem = fit.memory_scale if fit is not None else 1.0
                cal = self.evaluate_unchecked(c.layout, factors, mem)
                if cal is not None:
                    out.append(cal)
        return out

    def evaluate_unchecked(self, layout: Layout, factors: dict[str, float] | None, memory_factor: MemoryScale):
        """Planned under this calibration even when over HBM (prediction.feasible says whether it fits)."""
        return self._planned(layout, factors, memory_factor, check_memory=False)

    def gpu_hours(self, step_s: float, iters: int | None = None, *, startup_s: float | None = None) -> float:
        """What one launch costs (orchestrator.core.cost: start-up + the stage's full window unless `iters` says
        otherwise, a screen's or a probe's; `startup_s` a warm start's, schedule/fidelity.startup_s), charged
        as history.spent charges it."""
        n = self.stage.warmup_iters + self.stage.measure_iters if iters is None else iters
        s = self.stage.budget.startup_s if startup_s is None else startup_s
        return cost.launch_gpu_hours(self.stage.gpus, s, step_s, n)

    def probe_gpu_hours(self, probed_ranks: int, step_s: float) -> float:
        """What one rank probe costs (orchestrator.core.cost.rank_probe_gpu_hours): each probed rank one GPU for
        start-up + its window (stage.screen.probe_warmup_iters + probe_iters); `step_s` (the full step) bounds
        its compute-only step."""
        st = self.stage
        iters = st.screen.probe_warmup_iters + st.screen.probe_iters
        return cost.rank_probe_gpu_hours(probed_ranks, st.budget.startup_s, step_s, iters)

    def proposal(
        self,
        planned,
        *,
        reason: str,
        factors: dict[str, float] | None = None,
        memory_factor: MemoryScale = 1.0,
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
        if self.revived(mem, planned.prediction.memory_gb):
            pred["revived"] = {"raw_memory_gb": mem, "calibrated_memory_gb": planned.prediction.memory_gb}
            reason += (
                f" (revived: pruned by the uncalibrated memory model at {mem:.1f} GB, "
                f"fits calibrated at {planned.prediction.memory_gb:.1f} GB)"
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
