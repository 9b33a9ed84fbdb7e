"""The search's evidence, read from the ledger: each candidate's latest outcome as an Observation, the keys
already tried or rejected, the stage's step-time noise, the warm launches' settled warm-ups, the rank probes'
margin and provenance, and the measured best.

Read-only (orchestrator/history/ writes nothing): recomputed from the ledger on each call, never cached across
rounds, so a resumed driver sees exactly what the killed one had written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.core import ranking
from orchestrator.core import windows as fidelity
from orchestrator.core.metrics import STEP_P50, STEP_P99, Measured
from orchestrator.core.schema import StageConfig
from orchestrator.core.states import AttemptState, CandidateStatus, EventKind, Fidelity
from orchestrator.evidence.metrics import GB_PER_MIB, robust_cv
from orchestrator.ledger.ledger import CandidateRow, Ledger, SweepRow
from orchestrator.ledger.rows import MeasuredRow, standing
from orchestrator.plan import probe as plan_probe
from orchestrator.plan.layout import Layout
from orchestrator.search import select
from orchestrator.search.env import PlanEnv
from orchestrator.search.select import EXCLUDED
from orchestrator.search.types import Observation


def known_keys(ledger: Ledger, sweep: SweepRow) -> set[str]:
    """This sweep's candidate keys and those its preflight rejected (Megatron's validation, the partition's
    MaxTime): a key here is never launched (again). Another sweep's keys are its own business: sweeps of one
    stage never read each other's rows (issue 22)."""
    return {c.key for c in ledger.candidates(sweep.name)} | rejected_keys(ledger, sweep.name)


def rejected_keys(ledger: Ledger, sweep: str) -> set[str]:
    """Candidate keys the sweep's preflight rejected (EventKind.PREFLIGHT events)."""
    return {k for e in ledger.events(sweep, kind=EventKind.PREFLIGHT) for k in ((e.data or {}).get("rejected") or {})}


def _raw(env: PlanEnv, cand: CandidateRow, layout: Layout):
    return cand.predicted.raw or env.raw(
        layout
    )  # candidates added by other tools (run-one, plan --save) carry no raw numbers


def _raw_probe(env: PlanEnv, cand: CandidateRow, layout: Layout) -> float | None:
    """The planner's raw compute-only step of the rank a probe times (Prediction.probe_step_s)."""
    return cand.predicted.probe_step_s or env.raw_probe_s(layout)


def stage_peaks(ranks: list[dict]) -> dict[int, float]:
    """PP stage -> its measured peak in GB (max over the stage's ranks; reserved, else allocated): what
    per-term memory calibration fits. Ranks without a known stage are left out."""
    out: dict[int, float] = {}
    for r in ranks:
        mb = r.get("reserved_mb") or r.get("allocated_mb")
        if r.get("pp_stage") is None or not mb:
            continue
        out[int(r["pp_stage"])] = max(out.get(int(r["pp_stage"]), 0.0), float(mb) * GB_PER_MIB)
    return out


def _raw_terms(env: PlanEnv, cand: CandidateRow, layout: Layout) -> tuple[dict[str, float], ...]:
    return cand.predicted.memory_terms_by_stage or env.raw_memory_terms(layout)


def _rank_probed(cands: Iterable[CandidateRow]) -> set[int]:
    """The candidates a rank probe ran (their decision names the probed ranks)."""
    return {c.id for c in cands if c.decision.probed_ranks()}


def _margin(
    rows: Iterable[MeasuredRow], probes: dict[int, Measured], rank_probed: set[int], stage: StageConfig
) -> float:
    """`probe_margin` from one read of the rows: each candidate's latest result and its latest probe."""
    pairs = [
        (at_scale, seen)
        for r in rows
        if r.fidelity != Fidelity.PROBE and r.candidate_id in rank_probed and r.candidate_id in probes
        if (at_scale := r.metrics.peak_gb) and (seen := probes[r.candidate_id].peak_gb)
    ]
    return select.probe_margin_gb(pairs, stage.probe_margin_gb)


def _probes(ledger: Ledger, sweeps: list[SweepRow]) -> dict[int, Measured]:
    return {c: m for s in sweeps for c, m in ledger.evidence.probes(s.name).items()}


def probe_margin(ledger: Ledger, sweeps: list[SweepRow], stage: StageConfig) -> float:
    """What a rank probe cannot see (NCCL and dispatcher buffers), learned from the layouts that were rank-probed
    and then ran at scale: their peak there against their latest probe's (select.probe_margin_gb), read from
    `Evidence.probes` because a layout's latest result is then the run at scale's; the stage's
    probe_margin_gb until one did."""
    rows = [r for s in sweeps for r in ledger.evidence.measured(sweep=s.name)]
    probed = _rank_probed(c for s in sweeps for c in ledger.candidates(s.name))
    return _margin(rows, _probes(ledger, sweeps), probed, stage)


@dataclass(frozen=True)
class ProbeProvenance:
    """Whose probes count: the provenance (plan/probe.provenance) of the newest rank probe is the stack the sweep
    probes on now; a probe of another provenance is no evidence (its candidate reads as unmeasured)."""

    current: tuple[str, str, str] | None
    counts: dict[tuple[str, str, str], int]
    stale: frozenset[int]  # candidate ids whose latest result is a probe of another provenance

    def line(self) -> str:
        if self.current is None:
            return "probes: none ran"
        n = self.counts.get(self.current, 0)
        out = f"probes: {n} on {plan_probe.provenance_text(self.current)}"
        others = sum(v for k, v in self.counts.items() if k != self.current)
        if others:
            out += f"; {others} on other versions, not evidence here"
        return out


def probe_provenance(probes: Mapping[int, Mapping[str, Any]]) -> ProbeProvenance:
    """From each candidate's latest probe (`Evidence.probes`, oldest first); a probe that reported no versions
    (it died before its sidecars) says nothing of its stack and is not counted."""
    keyed = {c: plan_probe.provenance(m.get("versions")) for c, m in probes.items() if m.get("versions")}
    if not keyed:
        return ProbeProvenance(None, {}, frozenset())
    current = list(keyed.values())[-1]
    counts: dict[tuple[str, str, str], int] = {}
    for k in keyed.values():
        counts[k] = counts.get(k, 0) + 1
    return ProbeProvenance(current, counts, frozenset(c for c, k in keyed.items() if k != current))


def provenance_of(ledger: Ledger, sweeps: list[SweepRow]) -> ProbeProvenance:
    """The probe provenance of these sweeps (`status`, the report)."""
    return probe_provenance(_probes(ledger, sweeps))


def observations(ledger: Ledger, sweeps: list[SweepRow], env: PlanEnv) -> list[Observation]:
    """Each candidate with its latest outcome: measured metrics, or the failure class of its last attempt. A rank
    probe of another provenance than the sweep's newest (`probe_provenance`) is no evidence: not read."""
    all_probes = _probes(ledger, sweeps)
    stale = probe_provenance(all_probes).stale
    rows = [
        r
        for s in sweeps
        for r in ledger.evidence.measured(sweep=s.name)
        if not (r.fidelity == Fidelity.PROBE and r.candidate_id in stale)
    ]
    measured: dict[int, Measured] = {}
    attempt_of: dict[int, int] = {}
    fidelity_of: dict[int, Fidelity] = {}
    partial: set[int] = set()
    # candidate -> its probe's compute-only p50 while the probe is its latest measurement. A layout that ran at
    # scale is fitted on its whole step, its probe aside: the probe's p50 is the last PP stage's compute while
    # the step waits on the slowest stage, and fitting the rest on that residual lost held-out rows
    # (docs/search-log.md, "The probe's evidence after a run at scale")
    probe_step: dict[int, float] = {}
    for row in rows:
        if row.fidelity == Fidelity.PROBE and (p50 := row.metrics.step_p50_s):
            probe_step[row.candidate_id] = p50
        measured[row.candidate_id] = row.metrics
        attempt_of[row.candidate_id] = row.attempt_id
        fidelity_of[row.candidate_id] = row.fidelity
        if row.partial:
            partial.add(row.candidate_id)
    cands = {s.name: ledger.candidates(s.name) for s in sweeps}
    rank_probed = _rank_probed(c for cs in cands.values() for c in cs)
    probes = {c: m for c, m in all_probes.items() if c not in stale}
    margin = _margin(rows, probes, rank_probed, env.stage)
    out: list[Observation] = []
    for s in sweeps:
        for c in cands[s.name]:
            layout = c.layout
            raw = _raw(env, c, layout)
            if raw is None:
                continue
            comps, step, mem = raw
            met = measured.get(c.id)
            fc = None
            if c.status == CandidateStatus.EXCLUDED:  # failed the correctness gate: never a best, a parent or promoted
                met, fc = None, EXCLUDED
            elif c.status in (CandidateStatus.FAILED, CandidateStatus.CANCELLED):  # unmeasured, or screened /
                atts = ledger.attempts(c.id)  # probed and then its full window failed (never re-queued again)
                fc = (atts[-1].failure_class or atts[-1].state) if atts else AttemptState.FAILED
            elif met is None:
                continue  # not measured yet: nothing to learn
            peak = met.peak_gb if met else None
            probed = fidelity_of.get(c.id) == Fidelity.PROBE and bool(met) and c.id in rank_probed
            extra = margin if probed else 0.0  # a rank probe's peak + what it cannot see
            peaks = stage_peaks(ledger.evidence.rank_memory(attempt_of[c.id])) if met else {}
            at_scale = bool(met) and fidelity_of.get(c.id) != Fidelity.PROBE
            earlier = probes[c.id].step_p50_s if at_scale and c.id in rank_probed and c.id in probes else None
            probe_now = c.id in probe_step and c.id in rank_probed
            out.append(
                Observation(
                    key=c.key,
                    layout=layout,
                    raw_components=dict(comps),
                    raw_step_s=step,
                    raw_memory_gb=mem,
                    # a probe answers "does it fit?" (its peak) and "how fast is its compute alone?" (probe_step_s,
                    # the composed step: orchestrator/search/compose.py), never "how fast is the step?"
                    step_s=met.step_p50_s if met and fidelity_of[c.id] != Fidelity.PROBE else None,
                    p99_s=met.step_p99_s if met and fidelity_of[c.id] != Fidelity.PROBE else None,
                    peak_gb=peak + extra if peak is not None else None,
                    failure_class=fc,
                    round=c.round,
                    hbm_gb=env.hardware.hbm_gb,
                    raw_memory_terms=_raw_terms(env, c, layout),
                    stage_peaks_gb={k: v + extra for k, v in peaks.items()},
                    fidelity=fidelity_of.get(c.id, Fidelity.FULL),
                    measure_iters=(met.get("measure_iters") or None) if met else None,
                    partial=c.id in partial,
                    probe_margin_gb=extra,
                    # a rank probe's compute-only step (a fit probe of old ran at full scale: no such step)
                    probe_step_s=probe_step.get(c.id) if c.id in rank_probed else None,
                    raw_probe_s=_raw_probe(env, c, layout) if probe_now or earlier else None,
                    earlier_probe_s=earlier or None,
                )
            )
    return out


NOISE_RUNS = 12  # the stage's step-time noise is pooled over its latest full-window runs


def step_cv(ledger: Ledger, sweeps: list[SweepRow]) -> float | None:
    """The stage's measured step-time noise (schedule/fidelity.robust_cv, pooled): what sizes a screen."""
    rows = [r for s in sweeps for r in ledger.evidence.measured(sweep=s.name) if r.fidelity == Fidelity.FULL]
    rows.sort(key=lambda r: r.attempt_id)
    return fidelity.pooled_cv(
        robust_cv([t for _, t, _, _ in ledger.evidence.step_samples(r.attempt_id) if t]) for r in rows[-NOISE_RUNS:]
    )


def settled(ledger: Ledger, sweeps: list[SweepRow]) -> tuple[int, ...]:
    """How many leading iterations each of these sweeps' warm-started measurements (full, screened or cut: each
    candidate's latest) ran above its steady step (its result's settled_iters): what a warm start's warm-up is
    learned from (schedule/fidelity.learned_warmup). A cold launch's warm-up also waits for routing: not read."""
    out = []
    for s in sweeps:
        warm = {c.id for c in ledger.candidates(s.name) if c.decision.warms}
        for r in ledger.evidence.measured(sweep=s.name):
            if r.candidate_id in warm and r.fidelity != Fidelity.PROBE and r.metrics.settled_iters is not None:
                out.append(r.metrics.settled_iters)
    return tuple(out)


def best_step_s(ledger: Ledger, sweep: str) -> float | None:
    """The p50 of `best_of` (None before a best): what the early cut's lines are drawn from."""
    best = best_of(ledger, sweep)
    return float(best[STEP_P50]) if best and best.get(STEP_P50) else None


def fastest_at_scale_s(ledger: Ledger, sweep: str) -> float | None:
    """The lowest p50 any launch at scale measured (a screen, a cut launch's screen, or a full window; not a rank
    probe's compute-only step): what a launch that saves the seed after a cut one is held to (sweep/seeding)."""
    steps = [
        r.metrics.step_p50_s
        for r in ledger.evidence.measured(sweep=sweep)
        if r.fidelity != Fidelity.PROBE and r.metrics.step_p50_s
    ]
    return float(min(steps)) if steps else None


def best_of(ledger: Ledger, sweep: str) -> dict | None:
    """The measured best of one sweep, as orchestrator.core.ranking decides it (the rows `best` ranks): for the
    live view, `status` and the sweep's last line."""
    r = ranking.best(ledger.evidence.measured(sweep=sweep), standing)
    if r is None:
        return None
    return {
        "key": r.key,
        "layout": r.layout.short(),
        STEP_P50: r.metrics.step_p50_s,
        STEP_P99: r.metrics.step_p99_s,
        "simulated": r.simulated,
        "candidate_id": r.candidate_id,
    }
