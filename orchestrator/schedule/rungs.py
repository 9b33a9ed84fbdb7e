"""The schedule: at which fidelity each layout of a round is measured, and how many fit in the round.

Why apart from the searcher (as Ray Tune keeps its searcher apart from its trial scheduler): a searcher
(orchestrator/search/policies.py) only ranks and proposes layouts; the rungs (probe, screen, full) and the
round's size and budget are the same decision whatever searched. So every searcher, `predicted_topk`
included, gets multi-fidelity rounds: once the stage's step-time noise is measured, new layouts are screened
at the short window sized from it; screened contenders the screen cannot separate from the best go back to
the full window (successive halving's next rung); with a calibrated memory model, the most promising layouts
it prunes inside its error band get a fit probe, and one that fits is measured next round. Probe first
(`policy.probe_first`): after round 0 every new layout beyond the searcher's first `policy.direct_per_round`
is rank-probed before any full-scale launch (one GPU per probed rank, a few GPU-hours next to a launch on N
GPUs), and is measured at scale only once its composed
step (orchestrator/search/compose.py: the probe's measured compute + the calibrated communication) is within
`policy.probe_pass` of the best measured step. Coverage probes (`policy.coverage_probes`): each round also
rank-probes the best rated layout of a knob value that no layout which ran on the stage carries.

The driver (orchestrator/sweep/decide.py) calls `Schedule.plan`, which asks the searcher for `size`
proposals, and `Schedule.waiting` (with that round's fit) once the searcher's own convergence test says it is
done.
"""

from __future__ import annotations

from orchestrator.core.schema import PolicyConfig, StageConfig
from orchestrator.core.states import Fidelity
from orchestrator.plan import probe as plan_probe
from orchestrator.plan import ranks
from orchestrator.plan.planner import Planned
from orchestrator.schedule import fidelity
from orchestrator.search import compose
from orchestrator.search.calibrate import Fit
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import (
    KNOBS,
    best_measured,
    diverse_top,
    fit_dominated,
    knob_value,
    oom_dominated,
    ran,
    same_memory,
    value_label,
)
from orchestrator.search.types import Observation, Proposal, Rate, RoundInput, RoundPlan, unrated

# Round 0's probes spread over these knob groups (select.diverse_top; "pp" carries VPP): the memory model's error
# is per term, so which pruned region fits is what round 0 cannot know.
ROUND0_PROBE_KNOBS = ("ep", "pp", "cp", "recompute")
# What a rank probe's compute-only step can tell apart (Schedule.coverage): every knob group but the dispatcher's
# (a probe runs alltoall whatever the layout's dispatcher, argv.probe_argv).
COVERED_KNOBS = tuple(group for group in KNOBS if group != "dispatcher")


class Schedule:
    """The rungs of one sweep, from `policy.*` (round sizes, probes) and `stage.screen.*` (windows, confirms)."""

    def __init__(self, cfg: PolicyConfig):
        self.cfg = cfg

    def plan(self, searcher, env: PlanEnv, inp: RoundInput, *, source_stage: StageConfig | None = None) -> RoundPlan:
        """One round: confirmations first, then the searcher's proposals (screened once noise is measured), fit
        probes ahead of them, all trimmed to the round's slots and the GPU-hours left."""
        fit = searcher.fit(env, inp)
        rate = searcher.estimate(inp, fit)
        screening = self.screening(env, inp)
        confirms = self.confirms(env, inp, fit, screening=screening, rate=rate)
        short = screening or self.warm_window(env, inp)  # a round of short launches proposes more of them
        size = self.round_size(inp, screening=short) - len(confirms)
        props = searcher.propose(env, inp, size=size, fit=fit, source_stage=source_stage)
        best = best_measured(inp.observations)
        if screening:
            props = [self.screened(env, p, inp.step_cv) for p in props]
        first = self.cfg.probe_first and best is not None and fit is not None and inp.round > 0
        if first:  # the searcher's best few at scale, as ever; the rest probed before any launch at scale
            keep = self.cfg.direct_per_round
            props = props[:keep] + [self.probe_first(env, p) for p in props[keep:]]
        elif self.seed_on_evidence(env, inp):
            props = [self.probe_first(env, p) for p in props]  # round 1 measures the best composed at scale
        elif self.cfg.probe_first and self.cfg.round0_full and inp.round == 0:  # the first few at scale
            keep = self.cfg.round0_full
            props = props[:keep] + [self.probe_first(env, p) for p in props[keep:]]
        if best is not None and fit is not None and self.cfg.probes_per_round > 0:
            props = self.probes(env, inp, fit, best.measured_step_s, {p.key for p in props}, rate) + props
        elif self.cfg.probe_led and inp.round == 0 and not inp.observations and self.cfg.round0_probes > 0:
            taken = {p.key for p in props}
            props = self.probes(env, inp, None, None, taken, limit=self.cfg.round0_probes) + props
        if best is not None and fit is not None and self.cfg.coverage_probes > 0:
            props = self.coverage(env, inp, fit, best.measured_step_s, {p.key for p in props}, rate) + props
        learned = fidelity.learned_warmup(env.stage, inp.settled)
        if not inp.seedless:
            self.warm(env, [*confirms, *props], inp.seed, learned)
        self.cut(env, [*confirms, *props], best.measured_step_s if best else None)
        left = inp.gpu_hours_left - sum(c.est_gpu_hours for c in confirms)
        props = self.within_budget(props, size, left)
        why = f"{len(props)} proposals" + (f" screened, {len(confirms)} confirmed" if screening or confirms else "")
        if learned is not None and any(p.warmup_iters is not None for p in [*confirms, *props]):
            why += (
                f"; warm-up {learned} iterations, learned from {len(inp.settled)} warm launches (settled after"
                f" at most {max(inp.settled)}; configured warm_start.warmup_iters {env.stage.warm_start.warmup_iters})"
            )
        return RoundPlan(proposals=props, fit=fit, reason=f"{why} ({searcher.name})", confirms=confirms, rate=rate)

    def waiting(self, inp: RoundInput, fit: Fit | None, rate: Rate = unrated) -> bool:
        """The sweep has not converged while a measurement it has already earned is still due: a screened
        contender's full-window confirmation, or the launch at scale of a layout a rank probe found to fit (or
        too close to call) whose composed step, as the searcher rates it, is within policy.probe_pass of the best
        (`passed`). Why the probed ones: a probe of the last rounds is evidence the search paid for, and a sweep
        that stopped on its stale rounds never measured it; on the bench that cost fresh twin:overpredicted s119
        its 1k optimum (15.4% short) and the tune set's twin:imbalance its 8k one (12.6% short), and no row was
        lost by waiting (docs/search-log.md "Probed layouts hold convergence")."""
        if fidelity.contenders(inp.observations, inp.step_cv, 1):
            return True
        return bool(self.passed(inp, fit, rate))

    # ---- the rungs ----------------------------------------------------------------------------------
    def seed_on_evidence(self, env: PlanEnv, inp: RoundInput) -> bool:
        """Round 0 rank-probes every layout before any launch at scale (policy.probe_led), so round 1's
        launches are the probed fits best composed step first (`passed`), and the one that saves the seed is the
        fastest the evidence knows. Why: that launch runs the stage's whole warm-up (300 iterations at 1k against
        a warm launch's 50), and the uncalibrated model's favourite, which saved it before, was up to 4x slower
        than the stage's best on unseen twin surfaces (10-16k of a 1k sweep's GPU-hours). A promoted stage too:
        the source's winner was measured on the source's GPU count, its mappings here are cold launches the
        memory model placed, and without this the stage leaned on how much of its region the source's ledger
        covered (docs/search-log.md "Round 0 on evidence", fresh seeds 104-111: 8k missed 5 of 16 rows after a
        probe-led 1k, 0 of 16 with it; on the tune set two 8k rows miss with it). Only where the warm start is on."""
        return self.cfg.probe_first and self.cfg.probe_led and inp.round == 0 and fidelity.warm_start_on(env.stage)

    @staticmethod
    def warm_window(env: PlanEnv, inp: RoundInput) -> bool:
        """Every launch at scale of this round loads the sweep's seed (stage.warm_start)."""
        return inp.seed is not None and not inp.seedless and fidelity.warm_start_on(env.stage)

    @staticmethod
    def screening(env: PlanEnv, inp: RoundInput) -> bool:
        """New layouts are screened after round 0, once noise is measured and a screen is shorter than a full run
        (a warm one once the sweep has a seed)."""
        return inp.round > 0 and fidelity.use_screen(env.stage, inp.step_cv, warm=Schedule.warm_window(env, inp))

    def round_size(self, inp: RoundInput, *, screening: bool = False) -> int:
        size = self.cfg.round0_size if inp.round == 0 else self.cfg.round_size
        if screening and self.cfg.screen_round_size:
            size = self.cfg.screen_round_size
        return max(0, min(size, inp.slots))

    @staticmethod
    def screened(env: PlanEnv, p: Proposal, cv: float | None, step_s: float | None = None) -> Proposal:
        """The proposal at the screen's window (sized from the stage's measured noise), charged for it (at
        `step_s`, else its predicted step)."""
        st = env.stage
        w, n = fidelity.window(st, Fidelity.SCREEN, fidelity.screen_iters(st, cv))
        p.fidelity, p.measure_iters = Fidelity.SCREEN, n
        p.charge_step_s = step_s or p.charge_step_s
        p.est_gpu_hours = env.gpu_hours(p.charge_step_s or p.predicted_step_s, w + n)
        return p

    @staticmethod
    def warm(env: PlanEnv, props: list[Proposal], seed: str | None, warmup: int | None = None) -> None:
        """Warm start (stage.warm_start, where it shortens the warm-up: fidelity.warm_start_on): once the sweep
        has a seed (history.seed) every launch at scale loads it and warms up only warm_start.warmup_iters, or
        `warmup` once the sweep's warm launches showed how long they take to settle (fidelity.learned_warmup).
        Without one, the round's first full-window launch saves it at its end and the round's other
        full-window launches wait for it (`after_seed`: they go once it is there, orchestrator/sweep/
        seeding.py), so only one launch of a sweep waits out the stage's own warm-up; a screen before any seed
        runs cold. Each is charged for its window and the seconds loading or saving adds (fidelity.startup_s).
        A rank probe neither loads nor saves: its compute does not wait for routing."""
        st = env.stage
        if not fidelity.warm_start_on(st):
            return
        saver = None
        for p in props:
            if p.fidelity == Fidelity.PROBE:
                continue
            p.warm_from = seed
            if seed is None and p.fidelity == Fidelity.FULL:
                p.seed_save, p.after_seed = saver is None, saver is not None
                saver = saver or p
            if p.decision().warms:
                p.warmup_iters = warmup
            d = p.decision()
            w, n = fidelity.window(st, p.fidelity, p.measure_iters, warm=d.warms, warmup=p.warmup_iters)
            p.est_gpu_hours = env.gpu_hours(
                p.charge_step_s or p.predicted_step_s, w + n, startup_s=fidelity.startup_s(st, d)
            )

    @staticmethod
    def cut(env: PlanEnv, props: list[Proposal], best_step_s: float | None) -> None:
        """The early cut (stage.screen.cut*, fidelity.CutLine) of every launch at scale, against the best
        full-window p50 as the round is planned. Each stays charged for its whole window: the cut is a saving
        measured when it happens (history.spent charges the iterations a result ran), never one assumed."""
        for p in props:
            line = fidelity.cut_line(env.stage, best_step_s, p.decision())
            p.cut = line

    def confirms(
        self,
        env: PlanEnv,
        inp: RoundInput,
        fit: Fit | None = None,
        *,
        screening: bool = False,
        rate: Rate = unrated,
    ) -> list[Proposal]:
        """Screened contenders (fidelity.contenders) back at the full window: successive halving's next rung;
        and layouts a probe found to fit (`passed`), now measured at scale (screened when the round screens)."""
        limit = min(env.stage.screen.confirm_per_round, inp.slots if inp.slots > 0 else 0)
        out = []
        for r, why in self.passed(inp, fit, rate):
            p = Proposal(
                key=r.key,
                layout=r.layout,
                predicted={},
                reason=(
                    f"{'probed-fit' if r.probed_fit else 'probed-close'}: max reserved "
                    f"{r.measured_peak_gb - r.probe_margin_gb:.1f} GB"
                    + (f" + {r.probe_margin_gb:.1f} GB probe margin" if r.probe_margin_gb else "")
                    + f" of {r.hbm_gb:.0f} GB"
                    + ("" if r.probed_fit else " (too close to call: the launch at scale decides)")
                    + why
                ),
                fidelity=Fidelity.FULL,
                est_gpu_hours=env.gpu_hours(r.raw_step_s),
                charge_step_s=r.raw_step_s,
            )
            out.append(self.screened(env, p, inp.step_cv, r.raw_step_s) if screening else p)
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
                charge_step_s=r.measured_step_s,
            )
            out.append(p)
        return out

    def passed(self, inp: RoundInput, fit: Fit | None, rate: Rate = unrated) -> list[tuple[Observation, str]]:
        """Probed layouts due a measurement at scale (found to fit; probe-led, policy.probe_led, also those too
        close to HBM to call with the probe margin, Observation.probe_ran, which only a launch at scale settles,
        an OOM there costing start-up and an iteration), best first, with why: every one while nothing is
        measured or calibrated (probe-led round 0: the best round0_size by composed step); else those whose
        composed step (Fit.predict_row: the probe's compute + the calibrated communication), as the searcher
        rates it (`rate`, Policy.estimate: calibrated_neighbours' optimistic bound from what the knob values
        measured elsewhere), is within policy.probe_pass of the best measured step, at most a round's worth.
        Why the rating: the composed step alone ran 16-22% over the truth for `mixed` optima (s175 1k: 77.5 s
        composed, 66.9 s true, cut 74.7 s), which were then never launched (docs/search-log.md, "A probed
        layout passes as the searcher rates it"). A probe without its compute-only step (a fit probe of old) passes."""
        rows = [r for r in inp.observations if (r.probe_ran if self.cfg.probe_led else r.probed_fit)]
        best = best_measured(inp.observations)
        if best is None and self.cfg.probe_led and any(r.probe_scale for r in rows):
            # round 0 probed before any launch at scale: the best composed first (the first saves the seed)
            def composed(r: Observation) -> float:
                return fit.predict_row(r) if fit is not None else compose.step({}, r.raw_components, r.probe_scale)

            ranked = sorted(rows, key=composed)[: max(1, min(self.cfg.round0_size, inp.slots))]
            return [(r, f"; composed step {composed(r):.4g}s, nothing measured at scale yet") for r in ranked]
        if fit is None or best is None:
            return [(r, "") for r in rows]
        cut = best.measured_step_s * (1.0 + self.cfg.probe_pass)
        scored = sorted((rate(r.layout, s := fit.predict_row(r)), s, i, r) for i, r in enumerate(rows))
        out = [
            (
                r,
                f"; composed step {s:.4g}s, rated {v:.4g}s, vs best {best.measured_step_s:.4g}s"
                if r.probe_scale
                else "",
            )
            for v, s, _, r in scored
            if v <= cut or r.probe_scale is None
        ]
        return out[: max(1, self.round_size(inp))]

    def probe_first(self, env: PlanEnv, p: Proposal) -> Proposal:
        """A new layout as a rank probe (the ranks that bound it, ranks.probe_ranks, one GPU each): its
        compute-only step composes its prediction before a launch at scale is spent on it (`passed`). A layout no
        probe can run as its job does (orchestrator/plan/probe.unprobeable) stays a launch at scale."""
        why_not = plan_probe.unprobeable(p.layout)
        if why_not is not None:
            p.reason += f" (not probed: {why_not})"
            return p
        bound = self.as_probe(env, p)
        p.reason += f" (probe first: ranks {', '.join(map(str, bound))} on one GPU each)"
        return p

    @staticmethod
    def as_probe(env: PlanEnv, p: Proposal) -> list[int]:
        """Make `p` a one-GPU rank probe of the ranks that bound it (ranks.probe_ranks: first PP stage, last, the
        planner's heaviest), for start-up + the probe window, charged one GPU per rank; the ranks."""
        bound = ranks.probe_ranks(p.layout, env.stage.gpus, p.predicted.get("heaviest_stage"))
        _, n = fidelity.window(env.stage, Fidelity.PROBE)
        p.fidelity, p.measure_iters, p.probe_ranks = Fidelity.PROBE, n, tuple(bound)
        p.est_gpu_hours = env.probe_gpu_hours(len(bound), p.predicted_step_s)
        return bound

    def probes(
        self,
        env: PlanEnv,
        inp: RoundInput,
        fit: Fit | None,
        best_step: float | None,
        taken: set[str],
        rate: Rate = unrated,
        *,
        limit: int | None = None,
    ) -> list[Proposal]:
        """Rank probes: the most promising layouts the calibrated memory model prunes while HBM lies inside its
        error band (env.memory_band), never one already known to fit or dominated by an OOM. Promising as the
        searcher rates them (`rate`, Policy.estimate: calibrated_neighbours' optimistic bound), not by the
        calibrated step alone, which is where the model is most wrong layout by layout. Each runs the
        ranks that bound the layout (ranks.probe_ranks: first PP stage, last, the planner's heaviest) alone
        on one GPU each with Megatron's --fake-process-group for start-up plus a few iterations, reading
        max reserved memory. One found to fit (its peak plus the learned probe margin under HBM,
        select.probe_margin_gb) is measured next round (`confirms`); one that OOMs teaches the calibration.

        Probe-led (policy.probe_led): one probe per memory footprint (select.same_memory): layouts that differ
        only in the dispatcher run the same probe (a flex layout is probed with alltoall, argv.probe_argv), so the
        best rated of them stands for the rest, and what it finds covers them (select.fit_dominated,
        oom_dominated), even a peak too close to HBM to call either way: a sibling's probe would read the same.
        And round 0 (`fit` and `best_step` None, policy.round0_probes): before anything ran, the uncalibrated model's
        band (memfit.DEFAULT_BAND) and its predicted step, with no reach: the memory model is the part of the
        planner least to be trusted exactly where the fastest layouts lie (activations 1.6-3x high on issue 19's
        unseen workloads), and a probe costs one GPU per probed rank for minutes, where a round-0 launch costs N."""
        seen = list(inp.observations) + list(inp.source)
        cut = best_step * (1.0 + self.cfg.max_predicted_loss) if best_step is not None else float("inf")
        factors = fit.factors if fit is not None else None
        pool = [
            c
            for c in env.memory_band(fit, factors)
            if not c.prediction.feasible
            and c.key not in inp.known_keys
            and c.key not in taken
            and not oom_dominated(c.layout, seen)
            and not fit_dominated(c.layout, inp.observations)  # known to fit: proposed, not probed
            and plan_probe.unprobeable(c.layout) is None
        ]
        rated = sorted(
            ((r, c) for c in pool if (r := rate(c.layout, c.prediction.step_time_s)) <= cut), key=lambda x: x[0]
        )
        # probe-led: one per memory footprint, the best rated first, none of a footprint a probe already read
        covered = [r.layout for r in inp.observations if r.fidelity == Fidelity.PROBE]
        one_each: list = []
        for _, c in rated:
            if self.cfg.probe_led and any(same_memory(c.layout, lay) for lay in covered):
                continue
            one_each.append(c)
            covered.append(c.layout)
        n = self.cfg.probes_per_round if limit is None else limit
        if best_step is None:  # round 0: nothing rates them yet, so cover the pruned region's knob values
            chosen = diverse_top(one_each, n, layout_of=lambda c: c.layout, knobs=ROUND0_PROBE_KNOBS)
        else:
            chosen = one_each[:n]
        why = "fit-probe: predicted {:.1f} GB, HBM within the model's error band"
        return [self.rank_probe(env, c, fit, why.format(c.prediction.memory_gb), best_step) for c in chosen]

    def coverage(
        self, env: PlanEnv, inp: RoundInput, fit: Fit, best_step: float, taken: set[str], rate: Rate = unrated
    ) -> list[Proposal]:
        """Coverage probes: for each knob value (PP x VPP, CP, EP, micro-batch, recompute) that no layout which ran
        on this stage's GPUs carries, the searcher's best rated layout with it gets a rank probe, the best rated
        values first, at most policy.coverage_probes a round. Why: a probe times the layout's own compute, which is
        where the calibrated model is wrong region by region, and a region no row of this stage measured has only
        the model to speak for it; its probe costs one GPU per probed rank for minutes. A probe that fits is
        measured at scale only when its composed step passes (`passed`), as any probe's. The dispatcher is left
        out: a rank probe runs alltoall whatever the layout's dispatcher (argv.probe_argv)."""
        seen = list(inp.observations) + list(inp.source)
        factors, mem = fit.factors, fit.memory_scale
        pool = [
            c
            for c in env.plan(factors, mem)
            if c.key not in inp.known_keys
            and c.key not in taken
            and not oom_dominated(c.layout, seen)
            and plan_probe.unprobeable(c.layout) is None
        ]
        rated = sorted(((rate(c.layout, c.prediction.step_time_s), i, c) for i, c in enumerate(pool)))
        best_of: dict[tuple, tuple[float, int, Planned]] = {}  # (knob, value) -> its best rated layout
        for knob in COVERED_KNOBS:
            covered = {knob_value(r.layout, knob) for r in inp.observations if ran(r)}
            for r, i, c in rated:
                best_of.setdefault((knob, knob_value(c.layout, knob)), (r, i, c))
            for value in covered:
                best_of.pop((knob, value), None)
        out: list[Proposal] = []
        for (knob, value), (_, _, c) in sorted(best_of.items(), key=lambda kv: kv[1][:2]):
            if len(out) < self.cfg.coverage_probes and all(p.key != c.key for p in out):
                why = f"coverage-probe: no layout with {value_label(knob, value)} ran here"
                out.append(self.rank_probe(env, c, fit, why, best_step))
        return out

    @staticmethod
    def rank_probe(env: PlanEnv, c: Planned, fit: Fit | None, why: str, best_step: float | None = None) -> Proposal:
        """A planned layout as a rank probe (`as_probe`), proposed for `why`."""
        factors, mem = (fit.factors, fit.memory_scale) if fit is not None else (None, 1.0)
        p = env.proposal(
            c,
            reason=why,
            factors=factors,
            memory_factor=mem,
            predicted_gain=1.0 - c.prediction.step_time_s / best_step if best_step else None,
        )
        bound = Schedule.as_probe(env, p)
        p.reason += f" (rank probe of ranks {', '.join(map(str, bound))} on one GPU each)"
        return p

    @staticmethod
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
