"""What attempts measured: results (one row per success), step samples and per-rank memory, the joined
`measured` view the policy learns from, and the verdicts about candidates (calibration fits, parity).

Idempotent per attempt: a result recorded twice (a resumed driver ingesting the same job) changes nothing.
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Any

from sqlalchemy import func, insert, select

from orchestrator.core.metrics import Measured
from orchestrator.core.prediction import Predicted
from orchestrator.core.states import AttemptRole, AttemptState, CandidateStatus, EventKind, Fidelity
from orchestrator.ledger import models as m
from orchestrator.ledger import queries
from orchestrator.ledger.convert import clean, decode, measured, now, to_row
from orchestrator.ledger.errors import LedgerError
from orchestrator.ledger.models import JSON_METRICS, RESULT_METRICS
from orchestrator.ledger.rows import CalibrationRow, CapacityRow, MeasuredRow, ParityRow
from orchestrator.ledger.store import Store, find_attempt, find_candidate, find_sweep


class Evidence:
    """What attempts measured, and the verdicts: `ledger.evidence` (it holds the ledger's Store)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # ---- results ------------------------------------------------------------------------------

    def record_result(self, attempt_id: int, result: dict[str, Any]) -> None:
        """Store a JobResult dict: result row (if ok), step samples and rank memory, in ONE transaction.

        Idempotent per attempt: a second call for the same attempt changes nothing.
        """
        with self.store.write() as s:
            cand_id = find_attempt(s, attempt_id).candidate_id
            c = find_candidate(s, cand_id, lock=True)  # lock order: candidate, then attempt
            a = find_attempt(s, attempt_id, lock=True)
            seen = s.scalar(select(func.count()).select_from(m.StepSample).where(m.StepSample.attempt_id == attempt_id))
            seen = seen or s.scalar(
                select(func.count()).select_from(m.RankMemory).where(m.RankMemory.attempt_id == attempt_id)
            )
            if seen or s.scalar(select(m.Result.id).where(m.Result.attempt_id == attempt_id)) is not None:
                return
            ok = bool(result.get("ok"))
            a.simulated = bool(result.get("simulated", a.simulated))
            for k in ("failure_class", "failure_detail", "exit_code"):  # keep what sacct already told us
                if result.get(k) not in (None, ""):
                    setattr(a, k, result[k])
            if not AttemptState.parse(a.state).terminal:  # a collected result ends the attempt
                final = AttemptState.parse(result.get("slurm_state"))
                a.state = final if final.terminal else AttemptState.COMPLETED if ok else AttemptState.FAILED
            if result.get("log_paths"):
                a.log_paths = [str(p) for p in result["log_paths"]]
            if result.get("sidecar_paths"):
                a.sidecar_paths = [str(p) for p in result["sidecar_paths"]]
            if result.get("gpu_capacity_gb"):  # what the job said the GPU holds (an OOM's message, too)
                a.gpu_capacity_gb = float(result["gpu_capacity_gb"])
                a.gpu_capacity_source = str(result.get("gpu_capacity_source") or "")[:40] or None
            a.updated_at = now()
            if ok:
                values = {k: result[k] for k in RESULT_METRICS if k in result and result[k] is not None}
                values.update(
                    timers_ms=clean(result.get("timers_ms") or {}),
                    versions=clean(result.get("versions") or {}),
                    run_env=clean(result.get("run_env") or {}),
                )
                r = m.Result(
                    attempt_id=attempt_id,
                    candidate_id=cand_id,
                    simulated=a.simulated,
                    **{k: v for k, v in values.items() if k != "simulated"},
                )
                s.add(r)
                s.flush()
                if a.role == AttemptRole.MEASURE and not _newer_result(s, c, a):  # a finalist's: evidence only
                    c.latest_result_id = r.id
            samples = [
                {"attempt_id": attempt_id, "iteration": i, "step_time_s": t, "lm_loss": loss, "grad_norm": g}
                for i, (t, loss, g) in enumerate(
                    zip_longest(
                        result.get("step_times_s") or [], result.get("lm_loss") or [], result.get("grad_norm") or []
                    )
                )
            ]
            if samples:
                s.execute(insert(m.StepSample), samples)
            ranks = [
                {
                    "attempt_id": attempt_id,
                    "rank": r["rank"],
                    "pp_stage": r.get("pp_stage"),
                    "allocated_mb": r.get("allocated_mb"),
                    "reserved_mb": r.get("reserved_mb"),
                    "source": r.get("source", "log"),
                }
                for r in result.get("rank_memory") or []
            ]
            if ranks:
                s.execute(insert(m.RankMemory), ranks)

    def result(self, attempt_id: int) -> Measured | None:
        """The stored metrics of one attempt (RESULT_METRICS), or None when it did not succeed."""
        with self.store.read() as s:
            r = s.scalars(select(m.Result).where(m.Result.attempt_id == attempt_id)).one_or_none()
            return None if r is None else measured(r)

    def update_result_metrics(self, attempt_id: int, **metrics: Any) -> Measured:
        """Set result columns of one attempt's stored result (a later measurement about the same run, e.g.
        a finalist's long-run window: ckpt_save_s, q_effective ...). Unknown names and a missing result row
        are LedgerErrors. Returns the row's metrics after the update."""
        unknown = set(metrics) - set(RESULT_METRICS) or set(metrics) & JSON_METRICS
        if unknown:
            raise LedgerError(f"update_result_metrics: not updatable {sorted(unknown)}")
        with self.store.write() as s:
            r = s.scalars(select(m.Result).where(m.Result.attempt_id == attempt_id).with_for_update()).one_or_none()
            if r is None:
                raise LedgerError(f"attempt {attempt_id} has no stored result to update")
            for k, v in metrics.items():
                setattr(r, k, clean(v))
            s.flush()
            return measured(r)

    def step_samples(self, attempt_id: int) -> list[tuple[int, float | None, float | None, float | None]]:
        """(iteration, step_time_s, lm_loss, grad_norm) of the measured window, in order."""
        with self.store.read() as s:
            q = (
                select(m.StepSample.iteration, m.StepSample.step_time_s, m.StepSample.lm_loss, m.StepSample.grad_norm)
                .where(m.StepSample.attempt_id == attempt_id)
                .order_by(m.StepSample.iteration)
            )
            return [(i, t, loss, g) for i, t, loss, g in s.execute(q)]

    def gpu_capacities(self, sweep: str) -> list[CapacityRow]:
        """Every attempt of the sweep whose evidence stated the GPU's capacity, in attempt order."""
        with self.store.read() as s:
            sw = find_sweep(s, sweep)
            q = (
                select(m.Attempt)
                .join(m.Candidate, m.Candidate.id == m.Attempt.candidate_id)
                .where(m.Candidate.sweep_id == sw.id, m.Attempt.gpu_capacity_gb.is_not(None))
                .order_by(m.Attempt.id)
            )
            return [
                CapacityRow(a.id, a.candidate_id, a.job_id, a.gpu_capacity_gb or 0.0, a.gpu_capacity_source or "")
                for a in s.scalars(q)
            ]

    def rank_memory(self, attempt_id: int) -> list[dict[str, Any]]:
        with self.store.read() as s:
            q = select(m.RankMemory).where(m.RankMemory.attempt_id == attempt_id).order_by(m.RankMemory.rank)
            return [
                {
                    "rank": r.rank,
                    "pp_stage": r.pp_stage,
                    "allocated_mb": r.allocated_mb,
                    "reserved_mb": r.reserved_mb,
                    "source": r.source,
                }
                for r in s.scalars(q)
            ]

    def measured(
        self, sweep: str | None = None, stage: str | None = None, model: str | None = None
    ) -> list[MeasuredRow]:
        """Every candidate with a successful result (its latest measure-role result: a finalist's job never is
        one), joined with its layout and predictions, and whether it failed the correctness gate: the rows
        orchestrator.core.ranking ranks (`MeasuredRow.standing`)."""
        with self.store.read() as s:
            q = queries.measured_select(sweep=sweep, stage=stage, model=model)
            out = []
            for sw, c, a, r, excluded in s.execute(q.order_by(m.Candidate.id)):
                out.append(
                    MeasuredRow(
                        sweep=sw.name,
                        stage=sw.stage,
                        model=sw.model,
                        hardware=sw.hardware,
                        candidate_id=c.id,
                        key=c.key,
                        round=c.round,
                        status=CandidateStatus(c.status),
                        layout=decode("layout", c.layout),
                        layer_pattern=c.layer_pattern,
                        predicted=Predicted(c.predicted),
                        verdict=c.verdict,
                        attempt_id=a.id,
                        attempt_no=a.attempt_no,
                        job_id=a.job_id,
                        simulated=r.simulated,
                        partial=r.partial,
                        metrics=measured(r),
                        fidelity=a.fidelity,
                        excluded=bool(excluded),
                        result_id=r.id,
                    )
                )
            return out

    def probes(self, sweep: str) -> dict[int, Measured]:
        """Candidate id -> the metrics of its latest rank probe (a measure attempt of fidelity probe), also
        once a run at scale is its latest result (`measured` hands out only that one): a probed layout's peak
        at scale minus its probe's is what the probe margin is learned from. Oldest probe first."""
        with self.store.read() as s:
            sw = find_sweep(s, sweep)
            latest = (
                select(func.max(m.Result.id))
                .join(m.Attempt, m.Attempt.id == m.Result.attempt_id)
                .join(m.Candidate, m.Candidate.id == m.Result.candidate_id)
                .where(
                    m.Candidate.sweep_id == sw.id,
                    m.Attempt.fidelity == Fidelity.PROBE,
                    m.Attempt.role == AttemptRole.MEASURE,
                )
                .group_by(m.Result.candidate_id)
            )
            rows = s.scalars(select(m.Result).where(m.Result.id.in_(latest)).order_by(m.Result.id))
            return {r.candidate_id: measured(r) for r in rows}  # oldest first

    # ---- calibration, parity ------------------------------------------------------------------

    def record_calibration(self, sweep: str, round: int, fit: dict[str, Any], error: dict[str, Any]) -> CalibrationRow:
        with self.store.write() as s:
            sw = find_sweep(s, sweep)
            cal = m.Calibration(sweep_id=sw.id, round=round, fit=clean(fit), error=clean(error), created_at=now())
            s.add(cal)
            s.flush()
            return to_row(CalibrationRow, cal)

    def calibrations(self, sweep: str) -> list[CalibrationRow]:
        with self.store.read() as s:
            sw = find_sweep(s, sweep)
            q = select(m.Calibration).where(m.Calibration.sweep_id == sw.id).order_by(m.Calibration.id)
            return [to_row(CalibrationRow, c) for c in s.scalars(q)]

    def record_parity(
        self,
        candidate_id: int,
        *,
        reference_key: str,
        steps: int,
        max_loss_diff: float | None,
        max_grad_norm_diff: float | None,
        tolerance: float,
        passed: bool,
        detail: str = "",
    ) -> ParityRow:
        """A failing parity row excludes the candidate from `best`."""
        with self.store.write() as s:
            c = find_candidate(s, candidate_id)
            p = m.Parity(
                candidate_id=candidate_id,
                reference_key=reference_key,
                steps=steps,
                max_loss_diff=max_loss_diff,
                max_grad_norm_diff=max_grad_norm_diff,
                tolerance=tolerance,
                passed=bool(passed),
                detail=detail,
                created_at=now(),
            )
            s.add(p)
            s.add(
                m.Event(
                    sweep_id=c.sweep_id,
                    candidate_id=c.id,
                    kind=EventKind.PARITY,
                    # no reference key: nothing was compared (the candidate is its own reference), never "passed"
                    message=(
                        f"parity vs {reference_key[:10]}: {'passed' if passed else 'failed'} {detail}".strip()
                        if reference_key
                        else f"parity: {detail or 'not compared'}"
                        if passed
                        else f"parity: failed {detail}".strip()
                    ),
                )
            )
            s.flush()
            return to_row(ParityRow, p)

    def parity(self, candidate_id: int) -> list[ParityRow]:
        with self.store.read() as s:
            q = select(m.Parity).where(m.Parity.candidate_id == candidate_id).order_by(m.Parity.id)
            return [to_row(ParityRow, p) for p in s.scalars(q)]


def _newer_result(s: Any, c: m.Candidate, a: m.Attempt) -> bool:
    """The candidate's latest result is of a later attempt than `a` (an older folder ingested after it)."""
    if c.latest_result_id is None:
        return False
    q = select(m.Attempt.attempt_no).join(m.Result, m.Result.attempt_id == m.Attempt.id)
    later = s.scalar(q.where(m.Result.id == c.latest_result_id))
    return later is not None and later > a.attempt_no
