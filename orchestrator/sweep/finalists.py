"""Finalists: the correctness gate (parity vs a reference layout) and the long-run window (Q_effective), for
the top measured candidates once the search has stopped.

Every finalist job is an attempt of its candidate (states.AttemptRole: parity, parity-reference,
long-run-save, long-run-restore) and goes through the sweep driver's one launch path (orchestrator/sweep/loop.py:
launch intent before sbatch, job id recorded as its array exists, adoption on resume, polling, collection,
retries by sweep/retry.retry_decision). This module only says WHICH attempts are still needed and turns
finished ones into verdicts. It keeps no state of its own: each `step` reads the ledger, so a driver killed at
any moment resumes with exactly what is left: nothing runs twice, nothing is lost, each job is charged once
(as an attempt, history.spent).

- pick: the top `policy.search.promote_top_k` by the one ranking (orchestrator.core.ranking: full window, not
  partial, not excluded), recorded once in a `finalists` event, so an exclusion by the gate never pulls in
  another candidate on resume (a later round's measurement makes a new pick).
- parity: the candidate and its reference layout (`reference`: `parity.reference` overrides, CP1 by default,
  else the closest layout of the stage with those knobs that fits) run `parity.steps` iterations from the same
  seed; lm loss and grad norm (the attempts' stored step samples) must agree within the explicit tolerance. A
  failing candidate is `excluded` (never a best); one with nothing to compare with (its own reference, or no
  reference fits) is recorded as not compared. A reference shared by several finalists runs once, as an
  attempt of the first of them in pick order. `gate_price`: what the gate launches, for the dry run's price.
- long run: save at X then exit, restore and train on (runspec.long_run_save_spec / long_run_restore_spec);
  the measured save / restore seconds and post-restart tokens/s give Q_effective, stored on the candidate's
  measured result (its measure attempt), and a `long-run` event records the outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from orchestrator import runspec
from orchestrator.core.knobs import search_fields
from orchestrator.core.ranking import ranked
from orchestrator.core.schema import RootConfig, SearchConfig
from orchestrator.core.states import AttemptRole, CandidateStatus, EventKind
from orchestrator.evidence import parity as parity_mod
from orchestrator.evidence.effective import effective_throughput
from orchestrator.ledger.ledger import AttemptRow, CandidateRow, Ledger, MeasuredRow, ParityRow
from orchestrator.ledger.rows import standing
from orchestrator.plan import planner
from orchestrator.plan.layout import Layout
from orchestrator.sweep.launches import Launch, planned_from_row

Retry = Callable[[str, list[AttemptRow]], tuple[bool, str]]  # the driver's: (failure class, attempts) -> again?


class Outcome(StrEnum):
    """Where a finalist's job of one role stands, from its attempts."""

    LAUNCH = "launch"  # none ran yet (or only intents that never ran), or the last failed and is retried
    LIVE = "live"  # one is pending or running
    OK = "ok"  # the last one that ran left a result
    FAILED = "failed"  # the last one that ran failed and is not retried


@dataclass
class Step:
    launches: list[Launch] = field(default_factory=list)  # attempts still needed now
    notes: list[str] = field(default_factory=list)  # verdicts recorded by this step, for the live view


def pick(ledger: Ledger, sweep: str, k: int) -> list[CandidateRow]:
    """The k best measured candidates by the one ranking: the finalists (no screen, no probe, nothing partial
    or excluded)."""
    rows = ranked(ledger.evidence.measured(sweep=sweep), standing)[: max(0, k)]
    by_id = {c.id: c for c in ledger.candidates(sweep)}
    return [by_id[m.candidate_id] for m in rows]


# Knobs that change what a step computes, not where it runs: a reference keeps its finalist's (the gate compares
# numerics, so only the layout may differ between the two runs).
NUMERICS = ("optim", "capacity_factor")


def reference_layout(cfg: RootConfig, layout: Layout) -> Layout:
    """The candidate's layout with `parity.reference` knobs overridden (CP1 by default): the reference it is
    compared with when the stage allows it (`reference`)."""
    return layout.but(**dict(cfg.parity.reference))


def reference(
    cfg: RootConfig, layout: Layout, legal: Callable[[], Sequence[planner.Planned]]
) -> tuple[planner.Planned | None, str]:
    """The layout a finalist is compared with, planned: `reference_layout` when the planner allows it in this
    stage, else the stage's legal layout that fits with the reference knobs and the finalist's numerics
    (NUMERICS), the fewest other knobs changed, then the fastest predicted. At scale the plain override rarely
    fits (CP8 -> CP1 holds 8x the activations per rank: 8k's round-0 layouts all break mem.exceeds_hbm or
    mcore.vpp_group_bounds), so without this a gate on by default would exclude every CP>1 winner. `legal`: the
    stage's planned layouts (planner.plan), asked for only when the override does not plan. (None, why): no
    layout of the stage has the reference knobs and fits."""
    nominal = reference_layout(cfg, layout)
    planned, why = _planned(cfg, nominal)
    if planned is not None:
        return planned, ""
    want = {**{k: getattr(layout, k) for k in NUMERICS}, **dict(cfg.parity.reference)}
    fits = [
        p
        for p in legal()
        if p.prediction.feasible and all(getattr(p.layout, k) == v for k, v in want.items()) and p.layout != layout
    ]
    if not fits:
        shown = " ".join(f"{k}={v}" for k, v in want.items())
        return None, f"{nominal.short()} {why}, and no layout of the stage with {shown} fits"
    base = nominal.to_dict()
    return min(
        fits, key=lambda p: (sum(v != base[k] for k, v in p.layout.to_dict().items()), p.prediction.step_time_s)
    ), ""


@dataclass(frozen=True)
class GatePrice:
    """What the gate would launch for some finalists (the dry run's line, sweep/preview.py)."""

    finalists: int
    jobs: int  # each compared finalist and its reference (a shared reference once)
    gpu_hours: float  # each job: start-up + parity.steps iterations at its predicted step (core/cost)
    own: int  # finalists that are their own reference: not compared, nothing launched
    unmatched: int  # finalists with no reference the model allows: not compared, nothing launched

    def line(self, cfg: RootConfig, basis: str) -> str:
        p = cfg.parity
        if not p.enabled:
            return "parity gate: off (parity.enabled=false): the winner is never compared with a reference layout"
        ref = " ".join(f"{k}={v}" for k, v in dict(p.reference).items())
        alone = [f"{n} {why}" for n, why in ((self.own, "own reference"), (self.unmatched, "none fits")) if n]
        return (
            f"parity gate: top {self.finalists} finalist(s) beside a {ref} reference, {p.steps} steps: "
            f"{self.jobs} launch(es), predicted {self.gpu_hours:,.0f} GPU-hours"
            + (f"; not compared: {', '.join(alone)}" if alone else "")
            + f" ({basis}; parity.enabled=false skips it)"
        )


def gate_price(cfg: RootConfig, layouts: Sequence[Layout]) -> GatePrice:
    """The gate's launches and predicted GPU-hours for `layouts` taken as the finalists (the first
    `policy.search.promote_top_k`), planned as `Finalists` plans them."""
    from orchestrator.core import cost

    st = cfg.required_stage()
    chosen = list(dict.fromkeys(layouts))[: max(0, cfg.policy.search.promote_top_k)]
    legal: list[planner.Planned] = []

    def stage() -> list[planner.Planned]:
        if not legal:
            legal.extend(stage_layouts(cfg))
        return legal

    steps: dict[str, float] = {}  # key -> predicted step of each job (a shared reference once)
    own = unmatched = 0
    for lay in chosen:
        mine, _ = _planned(cfg, lay)
        if reference_layout(cfg, lay) == lay:
            own += 1
            continue
        ref, _ = reference(cfg, lay, stage) if mine is not None else (None, "")
        if mine is None or ref is None:
            unmatched += 1
            continue
        for p in (mine, ref):
            steps[p.key] = p.prediction.step_time_s
    hours = sum(cost.launch_gpu_hours(st.gpus, st.budget.startup_s, s, cfg.parity.steps) for s in steps.values())
    return GatePrice(len(chosen), len(steps), hours, own, unmatched)


def stage_layouts(cfg: RootConfig) -> list[planner.Planned]:
    """The layouts a reference may take (`reference`'s fallback): the stage's search lists with the reference
    knobs at their values, widened by `parity.search` (memory-saving knobs), planned on the same stage."""
    st = cfg.required_stage()
    lists = {k: list(getattr(st.search, k)) for k, _, _ in search_fields()}
    for k, values in dict(cfg.parity.search).items():
        lists[k] = lists[k] + [v for v in values if v not in lists[k]]
    for k, v in dict(cfg.parity.reference).items():
        lists[k] = [v]
    wide = dataclasses.replace(st, search=SearchConfig(**lists))
    res = planner.plan(cfg.model, cfg.hardware, wide, workload=cfg.workload.name, recipe=cfg.workload.recipe)
    return res.candidates


def _planned(cfg: RootConfig, layout: Layout, key: str | None = None) -> tuple[planner.Planned | None, str]:
    """The planner's verdict on `layout` in this stage: (Planned, "") or (None, why not)."""
    out = planner.evaluate(cfg.model, cfg.hardware, cfg.required_stage(), layout, workload=cfg.workload.name)
    if not isinstance(out, planner.Planned):
        return None, "breaks " + ", ".join(out.rule_ids)
    if not out.prediction.feasible:
        return None, f"predicted {out.prediction.memory_gb:.1f} GB does not fit {cfg.hardware.hbm_gb:g} GB"
    return (planner.Planned(out.layout, out.prediction, key=key) if key else out), ""


def _own(cfg: RootConfig, c: CandidateRow) -> tuple[planner.Planned | None, str]:
    """A finalist's own plan: its stored prediction, the layout it was measured at scale with (evidence over the
    model: an uncalibrated memory model that calls it over HBM excluded a measured winner from every stage's
    gate); the planner's verdict only for a row stored without one."""
    if c.prediction is not None:
        return planned_from_row(c), ""
    return _planned(cfg, c.layout, key=c.key)


@dataclass(frozen=True)
class _Gate:
    """One finalist's parity set-up: its planned layout and its reference's (None: why not in `why`)."""

    cand: CandidateRow
    mine: planner.Planned | None
    ref: planner.Planned | None
    ref_key: str
    same: bool  # the candidate's layout is the reference layout itself
    why: str = ""

    @property
    def runs(self) -> bool:
        return not self.same and self.mine is not None and self.ref is not None

    @property
    def alone(self) -> bool:
        """Nothing to compare with: its own reference, or no reference of the stage fits. Recorded as not
        compared (never "passed"), not excluded: with the gate on at every stage, 1k (where no CP1 layout fits
        141 GB) would otherwise exclude every winner."""
        return self.same or (self.mine is not None and self.ref is None)


class Finalists:
    """The finalists of one sweep, read from the ledger at every `step`."""

    def __init__(self, cfg: RootConfig, ledger: Ledger, sweep: str, retry: Retry):
        self.cfg, self.ledger, self.sweep, self.retry = cfg, ledger, sweep, retry
        self._chosen: list[CandidateRow] | None = None
        self._stage_layouts: list[planner.Planned] | None = None

    # ---- the pick -----------------------------------------------------------------------------------
    def chosen(self) -> list[CandidateRow]:
        """The recorded pick (the latest `finalists` event, while no newer measurement exists), else a fresh
        one, recorded now."""
        if self._chosen is not None:
            return self._chosen
        measured = self.ledger.evidence.measured(sweep=self.sweep)
        through = max((m.attempt_id for m in measured), default=0)
        events = self.ledger.events(self.sweep, kind=EventKind.FINALISTS)
        data = (events[-1].data or {}) if events else {}
        if events and data.get("measured_through") == through:
            keys = list(data.get("keys") or [])
        else:
            keys = [c.key for c in pick(self.ledger, self.sweep, self.cfg.policy.search.promote_top_k)]
            shown = ", ".join(c.layout.short() for c in self._rows(keys)) or "none measured"
            self.ledger.log_event(
                self.sweep,
                EventKind.FINALISTS,
                f"finalists (top {self.cfg.policy.search.promote_top_k} by the measured ranking): {shown}",
                data={"keys": keys, "measured_through": through},
            )
        self._chosen = self._rows(keys)
        return self._chosen

    def _rows(self, keys: Sequence[str]) -> list[CandidateRow]:
        by_key = {c.key: c for c in self.ledger.candidates(self.sweep)}
        return [by_key[k] for k in keys if k in by_key]

    # ---- one step -----------------------------------------------------------------------------------
    def step(self) -> Step:
        """Record every verdict whose attempts are in; return the attempts still needed now. No launch and no
        live finalist attempt means every verdict is recorded."""
        out = Step()
        numbers: dict[int, int] = {}  # next attempt number per candidate, within this step
        chosen = self.chosen()
        if self.cfg.parity.enabled:
            self._parity(chosen, out, numbers)
            chosen = [c for c in chosen if (rows := self.ledger.evidence.parity(c.id)) and all(p.passed for p in rows)]
        if self.cfg.effective.long_run:
            measured = {m.candidate_id: m for m in self.ledger.evidence.measured(sweep=self.sweep)}
            for c in chosen:
                self._long_run(c, measured.get(c.id), out, numbers)
        return out

    def _number(self, c: CandidateRow, numbers: dict[int, int]) -> int:
        """The attempt number (over every role) a new attempt of `c` gets: its folder's and its spec's."""
        numbers[c.id] = numbers.get(c.id, len(self.ledger.attempts(c.id, roles=None))) + 1
        return numbers[c.id]

    def _folder(self, key: str, name: str, cand: CandidateRow | None = None) -> Path:
        """`<cluster.folder>/<sweep>/<candidate folder>/<name>/` beside the candidate's measurement folders (a
        reference layout that is no candidate: its key alone)."""
        if cand is None:
            return runspec.attempt_dir(self.cfg, self.sweep, key, 0).parent / name
        lay = cand.layout
        return runspec.attempt_dir(self.cfg, self.sweep, key, 0, number=cand.id, layout=lay).parent / name

    def _outcome(self, c: CandidateRow, role: AttemptRole) -> tuple[Outcome, AttemptRow | None]:
        """Where `c`'s job of `role` stands; the last attempt that ran (a result to read, or a failure to name)."""
        atts = self.ledger.attempts(c.id, roles=(role,))
        if any(not a.terminal for a in atts):
            return Outcome.LIVE, None
        ran = [a for a in atts if not a.aborted]  # a launch intent that never ran is no try
        if not ran:
            return Outcome.LAUNCH, None
        last = ran[-1]
        if self.ledger.evidence.result(last.id) is not None:
            return Outcome.OK, last
        again, _ = self.retry(last.failure_class or last.state, ran)
        return (Outcome.LAUNCH if again else Outcome.FAILED), last

    # ---- parity -------------------------------------------------------------------------------------
    def _legal(self) -> list[planner.Planned]:
        if self._stage_layouts is None:  # planned once per driver: `step` runs at every poll
            self._stage_layouts = stage_layouts(self.cfg)
        return self._stage_layouts

    def _gate(self, c: CandidateRow) -> _Gate:
        lay = c.layout
        if reference_layout(self.cfg, lay) == lay:
            return _Gate(c, None, None, c.key, same=True, why=f"{lay.short()} is the reference layout itself")
        mine, why = _own(self.cfg, c)
        ref_planned, ref_why = reference(self.cfg, lay, self._legal) if mine is not None else (None, "")
        if mine is None:
            why = f"candidate {lay.short()} {why}"
        elif ref_planned is None:
            why = f"no reference to compare with: {ref_why}"
        return _Gate(c, mine, ref_planned, ref_planned.key if ref_planned else "", same=False, why=why)

    def _parity(self, chosen: list[CandidateRow], out: Step, numbers: dict[int, int]) -> None:
        gates = [self._gate(c) for c in chosen]
        owner: dict[str, _Gate] = {}  # reference key -> the finalist whose attempt runs the reference
        for g in gates:
            if g.runs:
                owner.setdefault(g.ref_key, g)
        asked: set[str] = set()  # reference keys launched in this step (one launch per shared reference)
        for g in gates:
            c = g.cand
            rows = self.ledger.evidence.parity(c.id)
            if rows:  # decided; a kill between the row and the exclusion left the status behind
                failed = next((p for p in rows if not p.passed), None)
                if failed is not None and c.status != CandidateStatus.EXCLUDED:
                    self.ledger.set_candidate_status(c.id, CandidateStatus.EXCLUDED, f"parity failed: {failed.detail}")
                continue
            row: ParityRow | None
            if g.alone:  # nothing different to compare with: recorded as not compared, never "passed against itself"
                row = self._verdict(c, "", None, f"not compared: {g.why}", passed=True)
            elif not g.runs:
                row = self._verdict(c, g.ref_key, None, g.why)
            else:
                row = self._compare(g, owner[g.ref_key], out, numbers, asked)
            if row is not None:
                if g.alone:  # row.detail: "not compared: ..." (its own reference, or none fits)
                    said = row.detail
                elif row.passed:
                    said = f"passed against reference {g.ref.layout.short() if g.ref else row.reference_key[:10]}"
                else:
                    said = f"FAILED, excluded from promotion ({row.detail})"
                out.notes.append(f"parity {c.layout.short()}: {said}")

    def _compare(
        self, g: _Gate, ref_owner: _Gate, out: Step, numbers: dict[int, int], asked: set[str]
    ) -> ParityRow | None:
        """The verdict once both runs are in (None: launched or still running)."""
        assert g.mine is not None and g.ref is not None
        c = g.cand
        mine, mine_att = self._outcome(c, AttemptRole.PARITY)
        ref, ref_att = self._outcome(ref_owner.cand, AttemptRole.PARITY_REFERENCE)
        for who, state, att in (("candidate", mine, mine_att), ("reference", ref, ref_att)):
            if state == Outcome.FAILED and att is not None:
                fc = att.failure_class or att.state
                return self._verdict(c, g.ref_key, None, f"{who} run failed: {fc} {att.failure_detail or ''}".strip())
        if mine == Outcome.OK and ref == Outcome.OK and mine_att is not None and ref_att is not None:
            p = self.cfg.parity
            loss, grad = self._curves(mine_att)
            ref_loss, ref_grad = self._curves(ref_att)
            verdict = parity_mod.compare(
                loss,
                ref_loss,
                grad,
                ref_grad,
                steps=p.steps,
                loss_rtol=p.loss_rtol,
                grad_norm_rtol=p.grad_norm_rtol,
            )
            return self._verdict(c, g.ref_key, verdict, verdict.detail, passed=verdict.passed)
        if mine == Outcome.LAUNCH:
            n = self._number(c, numbers)
            spec = runspec.parity_spec(
                self.cfg, g.mine, sweep=self.sweep, attempt=n, job_dir=self._folder(c.key, f"parity-{n}", c)
            )
            out.launches.append(Launch(c.id, spec))
        if ref == Outcome.LAUNCH and g.ref_key not in asked:
            asked.add(g.ref_key)
            o = ref_owner.cand
            n = self._number(o, numbers)
            folder = self._folder(g.ref_key, f"parity-reference-{o.key[:10]}-{n}")
            spec = runspec.parity_spec(
                self.cfg, g.ref, sweep=self.sweep, attempt=n, job_dir=folder, role=AttemptRole.PARITY_REFERENCE
            )
            out.launches.append(Launch(o.id, spec))
        return None

    def _curves(self, a: AttemptRow) -> tuple[list[float], list[float]]:
        """(lm loss, grad norm) per measured iteration, as the attempt's result stored them."""
        samples = self.ledger.evidence.step_samples(a.id)
        return [x for _, _, x, _ in samples if x is not None], [g for _, _, _, g in samples if g is not None]

    def _verdict(
        self,
        c: CandidateRow,
        ref_key: str,
        verdict: parity_mod.Parity | None,
        detail: str,
        *,
        passed: bool = False,
    ) -> ParityRow:
        """Record the parity row (no verdict = failed: no promotion without evidence) and exclude on failure."""
        row = self.ledger.evidence.record_parity(
            c.id,
            reference_key=ref_key,
            steps=verdict.steps if verdict else 0,
            max_loss_diff=verdict.max_loss_diff if verdict else (0.0 if passed else None),
            max_grad_norm_diff=verdict.max_grad_norm_diff if verdict else (0.0 if passed else None),
            tolerance=self.cfg.parity.loss_rtol,
            passed=passed,
            detail=detail,
        )
        # record_parity already logged the "parity" event (verdict and detail) in the same transaction
        if not passed:
            self.ledger.set_candidate_status(c.id, CandidateStatus.EXCLUDED, f"parity failed: {detail}")
        return row

    # ---- long run -----------------------------------------------------------------------------------
    def _long_run(self, c: CandidateRow, measured: MeasuredRow | None, out: Step, numbers: dict[int, int]) -> None:
        """Save at X, restart, restore, train on; the figures go on the candidate's measured result.

        Q_effective = steady tokens/s (the candidate's measurement) x effective fraction, with the save and
        restore seconds this window measured."""
        if self.ledger.events(self.sweep, kind=EventKind.LONG_RUN, candidate_id=c.id):
            return  # decided
        lay = c.layout
        if measured is None:
            return self._long_run_done(c, out, {"ok": False, "reason": "no measured result to attach the window to"})
        planned, why = _own(self.cfg, c)
        if planned is None:
            return self._long_run_done(c, out, {"ok": False, "reason": f"{lay.short()} {why}"})
        save_state, save = self._outcome(c, AttemptRole.LONG_RUN_SAVE)
        if save_state == Outcome.LIVE:
            return None
        if save_state == Outcome.LAUNCH:
            n = self._number(c, numbers)
            folder = self._folder(c.key, f"long-run-save-{n}", c)
            spec = runspec.long_run_save_spec(
                self.cfg, planned, sweep=self.sweep, attempt=n, job_dir=folder, ckpt_dir=folder / "ckpt"
            )
            out.launches.append(Launch(c.id, spec))
            return None
        assert save is not None
        saved = self.ledger.evidence.result(save.id) if save_state == Outcome.OK else None
        if saved is None or saved.get("ckpt_save_s") is None:
            why = "logged no save time" if saved is not None else f"failed: {save.failure_class or save.state}"
            detail = f"save job {why} {save.failure_detail or ''}".strip()
            return self._long_run_done(c, out, {"ok": False, "reason": detail, "folder": save.job_dir})
        restore_state, restore = self._outcome(c, AttemptRole.LONG_RUN_RESTORE)
        if restore_state == Outcome.LIVE:
            return None
        if restore_state == Outcome.LAUNCH:  # the checkpoint of the save that succeeded
            n = self._number(c, numbers)
            spec = runspec.long_run_restore_spec(
                self.cfg,
                planned,
                sweep=self.sweep,
                attempt=n,
                job_dir=self._folder(c.key, f"long-run-restore-{n}", c),
                ckpt_dir=Path(save.job_dir) / "ckpt",
            )
            out.launches.append(Launch(c.id, spec))
            return None
        assert restore is not None
        restored = self.ledger.evidence.result(restore.id) if restore_state == Outcome.OK else None
        if restored is None or restored.get("ckpt_restore_s") is None:
            why = "logged no load time" if restored is not None else f"failed: {restore.failure_class or restore.state}"
            detail = f"restore job {why} {restore.failure_detail or ''}".strip()
            return self._long_run_done(c, out, {"ok": False, "reason": detail, "folder": restore.job_dir})
        steady = measured.metrics.tokens_per_s or saved.tokens_per_s
        if steady is None:
            return self._long_run_done(c, out, {"ok": False, "reason": "no tokens/s measured"})
        eff = self.cfg.effective
        e = effective_throughput(
            steady,
            n_gpus=self.cfg.required_stage().gpus,
            save_s=saved["ckpt_save_s"],
            restore_s=restored["ckpt_restore_s"],
            checkpoint_interval_s=eff.checkpoint_interval_s,
            interruption_rate_per_gpu_hour=eff.interruption_rate_per_gpu_hour,
            restart_overhead_s=eff.restart_overhead_s,
        )
        values = {
            "ckpt_save_s": saved["ckpt_save_s"],
            "ckpt_restore_s": restored["ckpt_restore_s"],
            "tokens_per_s_after_restart": restored.get("tokens_per_s_after_restart"),
            "effective_fraction": e.effective_fraction,
            "q_effective": e.q_effective,
        }
        self.ledger.evidence.update_result_metrics(
            measured.attempt_id, **values
        )  # idempotent: a resume writes the same
        info = {
            "ok": True,
            "reason": "",
            "attempt_id": measured.attempt_id,
            "save_attempt_id": save.id,
            "restore_attempt_id": restore.id,
            "tokens_per_s": steady,
            **values,
            "interruptions_per_day": e.interruptions_per_day,
        }
        return self._long_run_done(c, out, info)

    def _long_run_done(self, c: CandidateRow, out: Step, info: dict) -> None:
        lay = c.layout.short()
        if info["ok"]:
            msg = (
                f"{lay}: save {info['ckpt_save_s']:.2f}s, restore {info['ckpt_restore_s']:.2f}s, "
                f"{info['tokens_per_s_after_restart'] or 0:,.0f} tok/s after restart, "
                f"Q_effective {info['q_effective']:,.0f} tok/s ({info['effective_fraction']:.1%})"
            )
        else:
            msg = f"{lay}: no long-run figures: {info['reason']}"
        self.ledger.log_event(self.sweep, EventKind.LONG_RUN, msg, candidate_id=c.id, data=info)
        out.notes.append(f"long-run {msg}")


def verdicts(ledger: Ledger, sweep: str, cfg: RootConfig) -> list[str]:
    """Record the verdicts a sweep's finalist attempts already decide, launching nothing: `ledger ingest`, once
    it stored those attempts, so a rebuilt ledger shows the verdicts (parity rows, exclusions, long-run figures)
    the lost one held; the attempts still needed are `resume`'s to launch. `cfg`: the sweep's stored config,
    with the GPUs' measured capacity (as the driver's finalists see it) and the driver's retry decision."""
    from orchestrator.history import effective_config
    from orchestrator.sweep.retry import retry_attempts

    cfg = effective_config(ledger, cfg, sweep)
    return Finalists(cfg, ledger, sweep, lambda fc, atts: retry_attempts(fc, atts, cfg.policy)).step().notes
