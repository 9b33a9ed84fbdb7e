"""The searchers ("policies"): which layouts to measure next, ranked, decided only from ledger observations.

A searcher only ranks and proposes layouts (`propose(env, inp, size=, fit=)` -> proposals, best first) and says
when its search has converged; at which fidelity each is measured (probe, screen, full), how many fit in a
round and its budget is the schedule's (orchestrator/schedule/), the same for every searcher.

`calibrated_neighbours` (default): round 0 takes the best predicted layouts with diversity across EP, PP
and CP; later rounds calibrate the planner on every measurement, re-rank, and spend the round on
one-factor neighbours of the best k *measured* layouts (local search trusts measurements over the model)
plus the calibrated model's top pick when it predicts a real gain.

`predicted_topk`: the baseline. Walks down the uncalibrated planner ranking, never looks at a measurement.
"""

from __future__ import annotations

import itertools
import math
import statistics

from orchestrator.core.failures import Failure
from orchestrator.core.schema import PolicyConfig, StageConfig
from orchestrator.core.states import EdgeKind
from orchestrator.plan.layout import Layout
from orchestrator.search.calibrate import Fit, calibrate
from orchestrator.search.env import PlanEnv
from orchestrator.search.moves import distinct_anchors, fit_residual, joint_pair, optimistic
from orchestrator.search.promote import promoted_layouts
from orchestrator.search.select import (
    best_measured,
    changed_knob,
    diverse_top,
    fit_dominated,
    knob_value,
    measured_rank,
    oom_dominated,
    ran,
    round_robin,
    standing,
)
from orchestrator.search.types import Observation, Proposal, Rate, RoundInput, unrated

DIVERSITY_SLACK = 1.5  # round 0 covers knob values only among layouts predicted within 1.5x of the best


class Policy:
    """Base: the searcher's contract and its convergence; subclasses implement `propose`."""

    name = "base"
    calibrates = False

    def __init__(self, cfg: PolicyConfig):
        self.cfg = cfg

    def fit(self, env: PlanEnv, inp: RoundInput) -> Fit | None:
        """The calibration this searcher ranks with (None: it ranks on the uncalibrated planner)."""
        return None

    def propose(
        self,
        env: PlanEnv,
        inp: RoundInput,
        *,
        size: int,
        fit: Fit | None = None,
        source_stage: StageConfig | None = None,
    ) -> list[Proposal]:
        """Up to `size` new layouts to measure, best first (the schedule sets their fidelity and trims them)."""
        raise NotImplementedError

    def estimate(self, inp: RoundInput, fit: Fit | None) -> Rate:
        """How this searcher rates a layout it has not measured, from the layout and its (calibrated) predicted
        step: what the schedule ranks the layouts it would rank-probe by (steps/fit_probes.probes), so the probes go
        where the searcher itself sees promise, and reads a probed layout's composed step by (round.passed).
        The base searcher takes the prediction as it is."""
        return unrated

    def converged(self, rows: list[Observation], converge_rounds: int) -> bool:
        """No gain > converge_gain over the best so far, nor a near-tie within it (stale_rounds), for
        `converge_rounds` (the stage's budget) consecutive rounds (round >= 1). (A screened contender still
        waiting for its confirmation is the schedule's to say: Schedule.waiting.)"""
        return self.stale_rounds(rows) >= converge_rounds

    def converged_reason(self, converge_rounds: int) -> str:
        """The stop reason `converged` stands for, in the words of its rule (stale_rounds)."""
        gain, n = f"{self.cfg.search.converge_gain:.0%}", converge_rounds
        return f"converged: no gain > {gain} over the best, nor a near-tie within {gain}, for {n} round{'s' * (n > 1)}"

    def stale_rounds(self, rows: list[Observation]) -> int:
        """The latest rounds in a row that brought no gain > converge_gain over the best before them, nor a new
        near-tie: a measurement that may be a best (orchestrator.core.ranking: full window, complete, passed
        parity) within converge_gain of that best, whose neighbours deserve a round (a round before any measured
        best counts as neither)."""
        rounds = sorted({r.round for r in rows})
        best_by_round = []
        for rnd in rounds:
            b = best_measured([r for r in rows if r.round <= rnd])
            best_by_round.append(b.measured_step_s if b else float("inf"))
        gain = self.cfg.search.converge_gain
        streak = 0
        for rnd, (prev, cur) in zip(rounds[1:], itertools.pairwise(best_by_round), strict=True):
            near = any(
                r.round == rnd and standing(r).eligible and r.measured_step_s <= prev * (1.0 + gain) for r in rows
            )
            gained = prev != float("inf") and (cur < prev * (1.0 - gain) or near)
            streak = 0 if gained or prev == float("inf") else streak + 1
        return streak

    def _promotions(
        self, env: PlanEnv, inp: RoundInput, source_stage: StageConfig, fit: Fit | None, limit: int
    ) -> list[Proposal]:
        """The source stage's winner and the best evidence of each of its regions (EP, PP, CP; a screened result
        is evidence too), up to promote_top_k, each mapped to this stage (CP restores m, EP kept/widened). The
        winner always leads: when the memory model (calibrated on another stage's GPUs' counts) prunes every
        mapping of it, its first legal mapping goes anyway and its run decides."""
        factors, mem = (fit.factors, fit.memory_scale) if fit else (None, 1.0)
        per_source: list[list[Proposal]] = []

        def fits(lay) -> bool:
            return env.evaluate(lay, factors, mem) is not None

        def legal(lay) -> bool:  # every rule but memory
            return env.evaluate_unchecked(lay, factors, mem) is not None

        full = measured_rank(inp.source, full_only=True)
        winner = full[:1]
        regions = distinct_anchors(inp.source, self.cfg.search.promote_top_k, knobs=("ep", "pp", "cp"))
        sources = winner + [r for r in regions if not winner or r.key != winner[0].key]
        for i, src in enumerate(sources[: self.cfg.search.promote_top_k]):
            props = []
            mapped = promoted_layouts(src.layout, source_stage, env.stage, feasible=fits)
            if not mapped and winner and i == 0:
                mapped = promoted_layouts(src.layout, source_stage, env.stage, feasible=legal)[:1]
            for lay in mapped:
                planned = env.evaluate(lay, factors, mem) or env.evaluate_unchecked(lay, factors, mem)
                if planned is not None and planned.key not in inp.known_keys:
                    props.append(
                        env.proposal(
                            planned,
                            reason="promoted",
                            factors=factors,
                            memory_factor=mem,
                            parent_key=src.key,
                            edge_kind=EdgeKind.PROMOTED_FROM,
                        )
                    )
            per_source.append(props)
        return round_robin(per_source, limit, key=lambda p: p.key)


# A measured knob effect transfers only where the knobs it depends on hold the same values: the dispatcher's
# on how many nodes the EP group spans (moves.COUPLED's ("ep", "dispatcher")).
EFFECT_CONTEXT: dict[str, tuple[str, ...]] = {"dispatcher": ("ep",)}


def effect_key(a: Layout, b: Layout) -> tuple | None:
    """The key of the one-factor change a -> b in `knob_effects`: (knob, from, to, context), the context being
    the values of the knobs its effect depends on (EFFECT_CONTEXT), which a and b share. None: not one factor."""
    knob = changed_knob(a, b)
    if knob is None:
        return None
    return knob, knob_value(a, knob), knob_value(b, knob), effect_context(a, knob)


def effect_context(layout: Layout, knob: str) -> tuple:
    """The layout's values of the knobs `knob`'s effect depends on (EFFECT_CONTEXT)."""
    return tuple((k, knob_value(layout, k)) for k in EFFECT_CONTEXT.get(knob, ()))


def knob_effects(rows: list[Observation]) -> dict[tuple, list[float]]:
    """`effect_key` -> measured step ratios of every pair of measured layouts differing only in that knob.

    A knob change that was measured once predicts the same change elsewhere better than any analytic model
    (e.g. a dispatcher swap that changed nothing is not worth a run again), but only where the knobs coupled
    with it hold the same values: a dispatcher's effect depends on how many nodes the EP group spans, so a
    HybridEP measured slow at EP128 says nothing of HybridEP at EP32 (on the bench's cliffs surface it did, and
    the sweep never tried HybridEP again).
    """
    ok = [r for r in rows if r.ok]
    out: dict[tuple, list[float]] = {}
    for a in ok:
        for b in ok:
            key = effect_key(a.layout, b.layout) if a is not b else None
            if key:
                out.setdefault(key, []).append(b.measured_step_s / a.measured_step_s)
    return out


class CalibratedNeighbours(Policy):
    name = "calibrated_neighbours"
    calibrates = True

    def fit(self, env: PlanEnv, inp: RoundInput) -> Fit | None:
        """Calibrate on this stage's rows; borrow the source stage's when this stage has too few."""
        rows = list(inp.observations)
        if sum(r.ok for r in rows) < 3 and inp.source:
            rows += inp.source
        if not any(r.ok or r.failure_class == Failure.OOM for r in rows):
            return None
        return calibrate(rows, hbm_gb=env.hardware.hbm_gb, margin_gb=env.stage.memory_margin_gb)

    def propose(
        self,
        env: PlanEnv,
        inp: RoundInput,
        *,
        size: int,
        fit: Fit | None = None,
        source_stage: StageConfig | None = None,
    ) -> list[Proposal]:
        factors, mem = (fit.factors, fit.memory_scale) if fit else (None, 1.0)
        seen = list(inp.observations) + list(inp.source)
        here = list(inp.observations)  # only this stage's runs say what fits on its GPUs

        def known_fit(lay) -> bool:
            return fit_dominated(lay, here)

        planned = env.plan_with_evidence(factors, mem, known_fit) if any(map(ran, here)) else env.plan(factors, mem)
        cands = [c for c in planned if c.key not in inp.known_keys and not oom_dominated(c.layout, seen)]

        def mk(c, reason, **kw) -> Proposal:
            if not env.fits(c.prediction.memory_gb):  # kept by evidence (plan_with_evidence), not by the model
                gb = c.prediction.memory_gb
                reason += f" (known to fit: needs no more memory than a layout that ran; model {gb:.0f} GB)"
            return env.proposal(c, reason=reason, factors=factors, memory_factor=mem, **kw)

        best = best_measured(inp.observations)
        if inp.round == 0 and inp.source and source_stage is not None:
            n_new = max(1, size // 3)
            props = self._promotions(env, inp, source_stage, fit, size - n_new)
            taken = {p.key for p in props}
            return props + [mk(c, "model-top") for c in self._diverse(cands, size, taken)]
        if best is None:
            return [mk(c, "round0" if inp.round == 0 else "model-top") for c in self._diverse(cands, size, set())]
        trusted = fit is not None and fit.loo_mape is not None and fit.loo_mape <= self.cfg.search.model_trust_mape
        return self._local(inp, cands, best.measured_step_s, mk, size, trust_model=trusted, fit=fit)

    def estimate(self, inp: RoundInput, fit: Fit | None) -> Rate:
        """The optimistic bound the proposals rank by (calibrated x the residual model, less `explore` sds): a
        layout the calibrated step model rates slow but whose knob values measured faster than calibrated
        elsewhere is still promising (on twin:overpredicted the optimum's calibrated step was 28% over the best
        measured while its bound was 12% under it)."""
        if fit is None:
            return super().estimate(inp, fit)
        res = fit_residual(inp.observations, lambda r: fit.predict(r.raw_components))
        explore = self.cfg.search.explore

        def bound(layout: Layout, step_s: float) -> float:
            return optimistic(step_s, *res.predict(layout), explore)

        return bound

    def _diverse(self, cands: list, size: int, taken: set) -> list:
        pool = [c for c in cands if c.key not in taken]
        if not pool:
            return []
        cut = pool[0].prediction.step_time_s * DIVERSITY_SLACK
        near = [c for c in pool if c.prediction.step_time_s <= cut]
        if len(near) < size:
            near = pool[: max(size, len(near))]
        return diverse_top(near, max(0, size - len(taken)), layout_of=lambda c: c.layout)

    def _local(
        self, inp: RoundInput, cands: list, best_step: float, mk, size: int, *, trust_model: bool, fit: Fit | None
    ) -> list[Proposal]:
        """One round of local and model-guided search (see moves.py for why each part exists):
        - model picks: the unmeasured layouts with the best optimistic bound (calibrated x residual model,
          less `explore` sds), the calibrated model's most promising *or* least known layouts;
        - per anchor (the best measured layouts of distinct EP/PP/CP regions): its best one-factor
          neighbour per knob and best joint move per coupled pair first, then the rest, by estimate;
        - the calibrated model's top pick when it has earned trust (LOO MAPE <= model_trust_mape)."""

        def calibrated(r: Observation) -> float:
            return fit.predict(r.raw_components) if fit else r.raw_step_s

        res = fit_residual(inp.observations, calibrated)
        explore = self.cfg.search.explore
        bounds = {}
        for c in cands:
            mean, sd = res.predict(c.layout)
            bounds[c.key] = (optimistic(c.prediction.step_time_s, mean, sd, explore), sd, mean)
        cut = best_step * (1.0 - self.cfg.search.converge_gain)

        def gain(est: float) -> float:
            return 1.0 - est / best_step

        def worth(est: float) -> bool:
            """A run whose optimistic estimate is still more than policy.search.max_predicted_loss slower than the
            best measured teaches little and costs a full window: not proposed."""
            return est <= best_step * (1.0 + self.cfg.search.max_predicted_loss)

        lists: list[list[tuple]] = []  # (planned, reason, parent_key, est, sd)
        if trust_model:

            def expected(c) -> float:
                return c.prediction.step_time_s * math.exp(bounds[c.key][2])

            top = [c for c in sorted(cands, key=expected)[:1] if expected(c) < cut]
            lists += [[(c, "model-top", None, expected(c), None)] for c in top]
        picks_ranked = sorted((c for c in cands if bounds[c.key][0] < cut), key=lambda c: bounds[c.key][0])
        n_model = min(self.cfg.search.model_picks, size)
        model: list[tuple] = [(c, "model-pick", None, bounds[c.key][0], bounds[c.key][1]) for c in picks_ranked]
        effects = knob_effects(inp.observations)
        per_anchor: list[list[tuple]] = []
        for b in distinct_anchors(
            inp.observations, self.cfg.search.top_k_neighbours, min_diff=self.cfg.search.anchor_distance
        ):
            b_mean, _ = res.predict(b.layout)
            b_pred = calibrated(b) * math.exp(b_mean)

            def est(c, b=b, b_pred=b_pred) -> float:
                """Optimistic step of neighbour c, relative to b's measurement: the measured effect of the same
                knob change elsewhere in the ledger, with its coupled knobs as here (effect_key), when there is
                one (known, so taken as is), else the residual model's optimistic bound for c over its estimate
                of b."""
                key = effect_key(b.layout, c.layout)
                seen = effects.get(key) if key else None
                if seen:
                    return b.measured_step_s * statistics.median(seen)
                return b.measured_step_s * bounds[c.key][0] / max(b_pred, 1e-12)

            moves: dict[str, list] = {}
            for c in cands:
                knob = changed_knob(b.layout, c.layout)
                pair = None if knob else joint_pair(b.layout, c.layout)
                if knob:
                    moves.setdefault(f"neighbour:{knob}", []).append(c)
                elif pair and self.cfg.search.joint_moves:
                    moves.setdefault(f"joint:{pair[0]}+{pair[1]}", []).append(c)
            ranked = {k: sorted(v, key=est) for k, v in moves.items()}
            # the guide's order: one factor first (best per knob), then the small joint search, then the rest
            firsts = sorted(((k, v[0]) for k, v in ranked.items()), key=lambda t: (t[0].startswith("joint"), est(t[1])))
            rest = sorted(((k, c) for k, v in ranked.items() for c in v[1:]), key=lambda t: est(t[1]))
            per_anchor.append([(c, k, b.key, est(c), bounds[c.key][1]) for k, c in firsts + rest if worth(est(c))])

        # The best's sibling with a dispatcher never measured at its EP is measured, not modelled: the planner
        # prices the dispatchers worst of all knobs (docs/validate.md). One a round, the one the estimate favours.
        def where(lay: Layout) -> tuple:
            return effect_context(lay, "dispatcher"), knob_value(lay, "dispatcher")

        tried = {where(r.layout) for r in inp.observations if r.ok}
        anchor_moves = per_anchor[0] if per_anchor else []
        sibling = next(
            (t for t in anchor_moves if t[1] == "neighbour:dispatcher" and where(t[0].layout) not in tried), None
        )
        if sibling:
            lists.append([sibling])
        picks = round_robin(lists, size, key=lambda t: t[0].key)
        taken = {t[0].key for t in picks}
        picks += [t for t in model if t[0].key not in taken][: max(0, min(n_model, size - len(picks)))]
        picks = round_robin([picks, *per_anchor], size, key=lambda t: t[0].key)
        if len(picks) < size:  # neighbourhood exhausted: fall back to the model picks, then the ranking
            filled = min(size, len(picks) + self.cfg.search.fill_per_round)  # the fill-up is capped, the round not
            taken = {t[0].key for t in picks}
            more = [t for t in model if t[0].key not in taken]
            more += [(c, "model-top", None, c.prediction.step_time_s, None) for c in cands if worth(bounds[c.key][0])]
            picks = round_robin([picks, more], filled, key=lambda t: t[0].key)
        return [
            mk(
                c,
                reason,
                parent_key=parent,
                edge_kind=None if not parent else EdgeKind.JOINT if reason.startswith("joint") else EdgeKind.NEIGHBOUR,
                predicted_gain=gain(est_s),
                uncertainty=sd,
            )
            for c, reason, parent, est_s, sd in picks
        ]


class PredictedTopK(Policy):
    """Baseline: the planner's own ranking, no calibration, no measurement feedback."""

    name = "predicted_topk"

    def propose(
        self,
        env: PlanEnv,
        inp: RoundInput,
        *,
        size: int,
        fit: Fit | None = None,
        source_stage: StageConfig | None = None,
    ) -> list[Proposal]:
        props: list[Proposal] = []
        if inp.round == 0 and inp.source and source_stage is not None:
            props = self._promotions(env, inp, source_stage, None, size)
        taken = {p.key for p in props}
        for c in env.plan():
            if len(props) >= size:
                break
            if c.key not in inp.known_keys and c.key not in taken:
                props.append(env.proposal(c, reason="predicted-topk"))
        return props
