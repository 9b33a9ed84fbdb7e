"""The schedule: at which fidelity each layout of a round is measured, and how many fit in the round.

Why apart from the searcher (as Ray Tune keeps its searcher apart from its trial scheduler): a searcher
(orchestrator/search/policies.py) only ranks and proposes layouts; the rungs (probe, screen, full) and the
round's size and budget are the same decision whatever searched. So every searcher, `predicted_topk`
included, gets multi-fidelity rounds: once the stage's step-time noise is measured, new layouts are screened
at the short window sized from it; screened contenders the screen cannot separate from the best go back to
the full window (successive halving's next rung); with a calibrated memory model, the most promising layouts
it prunes inside its error band get a fit probe, and one that fits is measured next round.

The driver (orchestrator/sweep/decide.py) calls `Schedule.plan`, which asks the searcher for `size`
proposals, and `Schedule.waiting` before the searcher's own convergence test.
"""

from __future__ import annotations

from orchestrator.core.schema import PolicyConfig, StageConfig
from orchestrator.core.states import Fidelity
from orchestrator.plan import ranks
from orchestrator.schedule import fidelity
from orchestrator.search.calibrate import Fit
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import best_measured, fit_dominated, oom_dominated
from orchestrator.search.types import Observation, Proposal, RoundInput, RoundPlan


class Schedule:
    """The rungs of one sweep, from `policy.*` (round sizes, probes) and `stage.screen.*` (windows, confirms)."""

    def __init__(self, cfg: PolicyConfig):
        self.cfg = cfg

    def plan(self, searcher, env: PlanEnv, inp: RoundInput, *, source_stage: StageConfig | None = None) -> RoundPlan:
        """One round: confirmations first, then the searcher's proposals (screened once noise is measured), fit
        probes ahead of them, all trimmed to the round's slots and the GPU-hours left."""
        confirms = self.confirms(env, inp)
        screening = self.screening(env, inp)
        size = self.round_size(inp, screening=screening) - len(confirms)
        fit = searcher.fit(env, inp)
        props = searcher.propose(env, inp, size=size, fit=fit, source_stage=source_stage)
        if screening:
            props = [self.screened(env, p, inp.step_cv) for p in props]
        best = best_measured(inp.observations)
        if best is not None and fit is not None and self.cfg.probes_per_round > 0:
            props = self.probes(env, inp, fit, best.measured_step_s, {p.key for p in props}) + props
        left = inp.gpu_hours_left - sum(c.est_gpu_hours for c in confirms)
        props = self.within_budget(props, size, left)
        why = f"{len(props)} proposals" + (f" screened, {len(confirms)} confirmed" if screening or confirms else "")
        return RoundPlan(proposals=props, fit=fit, reason=f"{why} ({searcher.name})", confirms=confirms)

    def waiting(self, rows: list[Observation], cv: float | None) -> bool:
        """A screened contender still waits for its full-window confirmation: the sweep has not converged."""
        return bool(fidelity.contenders(rows, cv, 1))

    # ---- the rungs ----------------------------------------------------------------------------------
    @staticmethod
    def screening(env: PlanEnv, inp: RoundInput) -> bool:
        """New layouts are screened after round 0, once noise is measured and a screen is shorter than a full run."""
        return inp.round > 0 and fidelity.use_screen(env.stage, inp.step_cv)

    def round_size(self, inp: RoundInput, *, screening: bool = False) -> int:
        size = self.cfg.round0_size if inp.round == 0 else self.cfg.round_size
        if screening and self.cfg.screen_round_size:
            size = self.cfg.screen_round_size
        return max(0, min(size, inp.slots))

    @staticmethod
    def screened(env: PlanEnv, p: Proposal, cv: float | None) -> Proposal:
        """The proposal at the screen's window (sized from the stage's measured noise), charged for it."""
        st = env.stage
        w, n = fidelity.window(st, Fidelity.SCREEN, fidelity.screen_iters(st, cv))
        p.fidelity, p.measure_iters = Fidelity.SCREEN, n
        p.est_gpu_hours = env.gpu_hours(p.predicted_step_s, w + n)
        return p

    def confirms(self, env: PlanEnv, inp: RoundInput) -> list[Proposal]:
        """Screened contenders (fidelity.contenders) back at the full window: successive halving's next rung;
        and layouts a fit probe found to fit, now measured at the full window."""
        limit = min(env.stage.screen.confirm_per_round, inp.slots if inp.slots > 0 else 0)
        out = [
            Proposal(
                key=r.key,
                layout=r.layout,
                predicted={},
                reason=(
                    f"probed-fit: max reserved {r.measured_peak_gb - r.probe_margin_gb:.1f} GB"
                    + (f" + {r.probe_margin_gb:.1f} GB probe margin" if r.probe_margin_gb else "")
                    + f" of {r.hbm_gb:.0f} GB"
                ),
                fidelity=Fidelity.FULL,
                est_gpu_hours=env.gpu_hours(r.raw_step_s),
            )
            for r in inp.observations
            if r.probed_fit
        ]
        for r in fidelity.contenders(inp.observations, inp.step_cv, limit):
            hw = fidelity.half_width(inp.step_cv or 0.0, r.measure_iters or 1)
            best = best_measured(inp.observations)
            p = Proposal(
                key=r.key,
                layout=r.layout,
                predicted={},
                reason=f"confirm: screened p50 {r.measured_step_s:.4g}s +/- {hw:.1%}",
                fidelity=Fidelity.FULL,
                predicted_gain=(1.0 - r.measured_step_s / best.measured_step_s) if best else None,
                uncertainty=hw,
                est_gpu_hours=env.gpu_hours(r.measured_step_s),
            )
            out.append(p)
        return out

    def probes(self, env: PlanEnv, inp: RoundInput, fit: Fit, best_step: float, taken: set[str]) -> list[Proposal]:
        """Rank probes: the most promising layouts the calibrated memory model prunes while HBM lies inside its
        error band (env.memory_band), never one already known to fit or dominated by an OOM. Each runs the
        ranks that bound the layout (ranks.probe_ranks: first PP stage, last, the planner's heaviest) alone
        on one GPU each with Megatron's --fake-process-group for start-up plus a few iterations, reading
        max reserved memory. One found to fit (its peak plus the learned probe margin under HBM,
        select.probe_margin_gb) is measured next round (`confirms`); one that OOMs teaches the calibration."""
        seen = list(inp.observations) + list(inp.source)
        cut = best_step * (1.0 + self.cfg.max_predicted_loss)
        pool = [
            c
            for c in env.memory_band(fit, fit.factors)
            if not c.prediction.feasible
            and c.key not in inp.known_keys
            and c.key not in taken
            and c.prediction.step_time_s <= cut
            and not oom_dominated(c.layout, seen)
            and not fit_dominated(c.layout, inp.observations)  # known to fit: proposed, not probed
        ]
        out = []
        _, n = fidelity.window(env.stage, Fidelity.PROBE)
        for c in sorted(pool, key=lambda c: c.prediction.step_time_s)[: self.cfg.probes_per_round]:
            bound = ranks.probe_ranks(c.layout, env.stage.gpus, c.prediction.heaviest_stage)
            p = env.proposal(
                c,
                reason=(
                    f"fit-probe: predicted {c.prediction.memory_gb:.1f} GB, HBM within the model's error band; "
                    f"rank probe of ranks {', '.join(map(str, bound))} on one GPU each"
                ),
                factors=fit.factors,
                memory_factor=fit.memory_scale,
                predicted_gain=1.0 - c.prediction.step_time_s / best_step,
            )
            p.fidelity, p.measure_iters, p.probe_ranks = Fidelity.PROBE, n, tuple(bound)
            p.est_gpu_hours = env.probe_gpu_hours(len(bound), c.prediction.step_time_s)
            out.append(p)
        return out

    @staticmethod
    def within_budget(props: list[Proposal], slots: int, gpu_hours_left: float) -> list[Proposal]:
        """Keep proposals in order while runs and (estimated) GPU-hours last. A rank probe takes no slot: it
        uses no run (observe.uses_a_run), only its few one-GPU hours."""
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
