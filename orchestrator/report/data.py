"""Gather everything the report shows from the ledger, in one pass, into plain dataclasses.

Why a separate step: plots and HTML then work on plain data (testable without a database), and the
ledger is read once. Effective throughput is computed here with orchestrator.evidence.effective from the measured
save/restore times (or the configured defaults, flagged as such).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from orchestrator import history
from orchestrator.core import knobs, metrics, ranking
from orchestrator.core.metrics import STEP_P50
from orchestrator.core.price import against
from orchestrator.core.schema import EffectiveConfig, StageConfig
from orchestrator.core.states import CandidateStatus, EdgeKind, EventKind, Fidelity
from orchestrator.evidence.effective import effective_throughput
from orchestrator.ledger import queries
from orchestrator.ledger.ledger import Ledger, SweepRow
from orchestrator.report import path

KNOB_COLUMNS = tuple(k.column for k in knobs.DISPLAYED)  # every knob; the page shows those that vary
TABLE_COLUMNS = (
    "candidate_id",
    "key",
    "round",
    *KNOB_COLUMNS,
    "d_a",
    "d_e",
    "m",
    "pred_bubble",
    "status",
    "failure_class",
    "fidelity",
    "excluded",
    "result_id",
    *(k.name for k in metrics.METRICS if k.scalar),  # every metric of the registry
    "pred_step_time_s",
    "pred_memory_gb",
    "job_id",
    "attempt_no",
)


def standing(row: dict) -> ranking.Standing:
    """How orchestrator.core.ranking sees one row of the report (a `compare` row of TABLE_COLUMNS)."""
    return ranking.standing(
        row,
        fidelity=row.get("fidelity") or Fidelity.FULL,
        partial=bool(row.get("partial")),
        excluded=bool(row.get("excluded")),
        order=row.get("result_id") or 0,
    )


@dataclass
class Lineage:
    """One promoted candidate and its parent in the earlier stage (strong scaling at fixed B)."""

    parent_sweep: str
    parent_gpus: int
    parent_step_s: float | None
    child_sweep: str
    child_gpus: int
    child_step_s: float | None
    label: str
    parent_m: int | None
    child_m: int | None
    parent_bubble: float | None
    child_bubble: float | None
    candidate_id: int | None = None  # the promoted candidate (this stage's): the scaling figure's bar label

    @property
    def efficiency(self) -> float | None:
        """Strong-scaling efficiency = (T_small x N_small) / (T_big x N_big) at the same global batch."""
        if not self.parent_step_s or not self.child_step_s:
            return None
        return (self.parent_step_s * self.parent_gpus) / (self.child_step_s * self.child_gpus)


@dataclass
class Spend:
    """What the sweep cost and why it ended: the figure `status` and the budget check charge (history.spent,
    orchestrator.core.cost over the ledger's attempts), against the stage's budget."""

    gpu_hours: float  # every attempt of every fidelity (probe, screen, full) and the finalists
    by_fidelity: dict[str, float]
    runs: int
    rounds: int  # rounds the sweep planned (0..last)
    max_gpu_hours: float  # the stage's budget, as the sweep stored it
    max_runs: int
    max_rounds: int
    stop: str | None  # the driver's last "stop" event: why it stopped (None: never stopped yet)
    status: str  # the sweep's status (running, done, interrupted, cancelled)
    simulated: bool
    price: str | None = None  # spend against the whole sweep's simulated price (sweep/price.against), if stored


@dataclass
class ReportData:
    sweep: SweepRow
    gpus: int
    measured: list[dict]  # successful candidates, fastest first, with q_effective and deltas
    failed: list[dict]  # candidates whose latest attempt failed (failure_class)
    samples: dict[int, list[float]]  # candidate_id -> measured step times (s)
    calibrations: list[dict]  # round, fit, error
    rounds: list[dict]  # round -> best measured step so far, GPU-hours spent
    lineage: list[Lineage]
    parity: dict[int, dict]  # candidate_id -> latest parity row
    simulated: bool
    provenance: dict = field(default_factory=dict)
    effective_note: str = ""
    search_path: list[dict] = field(default_factory=list)  # orchestrator/report/path.py gather
    spend: Spend | None = None  # total spend, rounds, budget and the stop reason


def _gpus(sweep: SweepRow) -> int:
    try:
        cfg = yaml.safe_load(sweep.config_yaml) or {}
        return int(cfg["stage"]["gpus"])
    except (KeyError, TypeError, ValueError, yaml.YAMLError):
        return 0


def _effective_cfg(sweep: SweepRow) -> EffectiveConfig:
    try:
        cfg = (yaml.safe_load(sweep.config_yaml) or {}).get("effective") or {}
        known = EffectiveConfig.__dataclass_fields__
        return EffectiveConfig(**{k: v for k, v in cfg.items() if k in known})
    except (TypeError, ValueError, yaml.YAMLError):
        return EffectiveConfig()


def _with_effective(row: dict, gpus: int, eff: EffectiveConfig) -> dict:
    tps = row.get("tokens_per_s")
    save = row.get("ckpt_save_s")
    restore = row.get("ckpt_restore_s")
    row["ckpt_measured"] = save is not None and restore is not None
    if tps:
        e = effective_throughput(
            tps,
            n_gpus=gpus or 1,
            save_s=save if save is not None else eff.default_save_s,
            restore_s=restore if restore is not None else eff.default_restore_s,
            checkpoint_interval_s=eff.checkpoint_interval_s,
            interruption_rate_per_gpu_hour=eff.interruption_rate_per_gpu_hour,
            restart_overhead_s=eff.restart_overhead_s,
        )
        row["q_effective"] = e.q_effective
        row["effective_fraction"] = e.effective_fraction
    else:
        row["q_effective"] = row["effective_fraction"] = None
    return row


def gather(ledger: Ledger, name: str) -> ReportData:
    sweep = ledger.get_sweep(name)
    if sweep is None:
        names = ", ".join(s.name for s in ledger.list_sweeps()) or "none yet"
        from orchestrator.core.errors import UserError

        raise UserError(f"no sweep named {name!r} in the ledger (sweeps: {names})")
    gpus = _gpus(sweep)
    eff = _effective_cfg(sweep)
    rows = queries.compare(ledger, sweep=name, columns=list(TABLE_COLUMNS))
    measured = [
        _with_effective(r, gpus, eff)
        # full-window results only: a screen ranks and a fit probe answers "does it fit?"; neither is a measurement
        # the report compares, plots against its prediction or calls the best. Partial and excluded ones stay,
        # in the ranking's order, marked (the page strikes them out).
        for r in ranking.ordered(rows, standing)
        if r["status"] in (CandidateStatus.DONE, CandidateStatus.EXCLUDED) and Fidelity(r["fidelity"]) == Fidelity.FULL
    ]
    failed = [r for r in rows if r["failure_class"]]
    parity = {}
    for r in measured:
        checks = ledger.evidence.parity(r["candidate_id"])
        if checks:
            last = checks[-1]
            parity[r["candidate_id"]] = {
                "passed": last.passed,
                "detail": last.detail,
                "max_loss_diff": last.max_loss_diff,
                "reference_key": last.reference_key,
            }
    best = ranking.best(measured, standing)
    for r in measured:
        r["parity"] = parity.get(r["candidate_id"], {}).get("passed")
        r["delta_vs_best"] = (r[STEP_P50] / best[STEP_P50] - 1.0) if best else None

    attempts = {r["candidate_id"]: r["attempt_no"] for r in measured}
    samples: dict[int, list[float]] = {}
    cands = ledger.candidates(name)
    cand_attempt = {c.id: c.latest_attempt_id for c in cands}
    predicted = {c.id: c.predicted for c in cands}
    for r in measured:
        r.update(raw_predictions(predicted.get(r["candidate_id"], {})))
    for cid in attempts:
        aid = cand_attempt.get(cid)
        if aid is not None:
            samples[cid] = [s[1] for s in ledger.evidence.step_samples(aid) if s[1] is not None]

    stage = _stage(sweep, gpus)
    spent = history.spent(ledger, name, stage=stage)
    rounds = _rounds(measured, spent.by_round)
    lineage = _lineage(ledger, name, gpus)
    cal = [{"round": c.round, "fit": c.fit, "error": c.error} for c in ledger.evidence.calibrations(name)]
    simulated = any(r.get("simulated") for r in measured + failed) or sweep.workload == "twin"
    note = (
        "Q_effective uses measured checkpoint save/restore times where a long-run window ran, else the configured "
        f"defaults (save {eff.default_save_s:.0f} s, restore {eff.default_restore_s:.0f} s); interval "
        f"{eff.checkpoint_interval_s:.0f} s, {eff.interruption_rate_per_gpu_hour:.2e} interruptions per GPU-hour."
    )
    return ReportData(
        sweep=sweep,
        gpus=gpus,
        measured=measured,
        failed=failed,
        samples=samples,
        calibrations=cal,
        rounds=rounds,
        lineage=lineage,
        parity=parity,
        simulated=simulated,
        provenance={**(sweep.provenance or {}), "probes": history.provenance_of(ledger, [sweep]).line()},
        effective_note=note,
        search_path=path.gather(ledger, name),
        spend=_spend(ledger, sweep, stage, spent),
    )


def _spend(ledger: Ledger, sweep: SweepRow, stage: StageConfig, spent: history.Spent) -> Spend:
    """Spend, budget and the stop reason of one sweep (the budget is the stage's as the sweep stored it)."""
    stops = ledger.events(sweep.name, kind=EventKind.STOP)
    planned = [c.round for c in ledger.candidates(sweep.name)]
    b = stage.budget
    return Spend(
        gpu_hours=spent.gpu_hours,
        by_fidelity=dict(spent.by_fidelity),
        runs=spent.runs,
        rounds=max(planned) + 1 if planned else 0,
        max_gpu_hours=b.max_gpu_hours,
        max_runs=b.max_runs,
        max_rounds=b.max_rounds,
        stop=stops[-1].message if stops else None,
        status=str(sweep.status),
        simulated=spent.simulated,
        price=against(sweep.provenance, spent.gpu_hours),
    )


def raw_predictions(predicted: Mapping[str, Any]) -> dict:
    """The planner's UNcalibrated step and heaviest-rank memory for a candidate (`raw_pred_step_s`,
    `raw_pred_memory_gb`; None when unknown). Why: a candidate planned after calibration carries a calibrated
    prediction fitted on the measurements themselves, which sits near the diagonal by construction; the raw
    model against the measurement is what shows how wrong the model is."""
    uncal = not predicted.get("factors") and predicted.get("memory_factor", 1.0) in (1, 1.0, None)
    step = predicted.get("raw_step_time_s") or (predicted.get("step_time_s") if uncal else None)
    mem = predicted.get("raw_memory_gb") or (predicted.get("memory_gb") if uncal else None)
    return {"raw_pred_step_s": step, "raw_pred_memory_gb": mem}


def predicted_vs_measured(measured: list[dict]) -> list[dict]:
    """One point per measured candidate: round, raw and calibrated (at planning time) predictions, measurement;
    for step time (p50) and heaviest-rank memory (reserved, else allocated)."""
    out = []
    for r in measured:
        out.append(
            {
                "candidate_id": r["candidate_id"],
                "round": r["round"],
                "raw_step_s": r.get("raw_pred_step_s"),
                "cal_step_s": r.get("pred_step_time_s"),
                "step_s": r.get(STEP_P50),
                "raw_memory_gb": r.get("raw_pred_memory_gb"),
                "cal_memory_gb": r.get("pred_memory_gb"),
                "memory_gb": metrics.peak_gb(r),
            }
        )
    return out


def _stage(sweep: SweepRow, gpus: int) -> StageConfig:
    """The stage a sweep ran (its stored config), what its GPU-hours are charged on; a snapshot that does not
    compose (a ledger older than this code) gives the stage's defaults with its GPU count."""
    from orchestrator.config import root_from_yaml

    try:
        stage = root_from_yaml(sweep.config_yaml).stage
    except Exception:  # noqa: BLE001 - OmegaConf raises many types; the figure then uses the defaults
        stage = None
    return stage if stage is not None else StageConfig(gpus=gpus)


def _rounds(measured: list[dict], gpu_hours_by_round: dict[int, float]) -> list[dict]:
    """Per round: the measured best so far (orchestrator.core.ranking) and the GPU-hours spent so far, every
    attempt of every fidelity with its start-up and the finalists (history.spent: what `status` and the budget
    charge)."""
    out, spent = [], 0.0
    for rnd in sorted({r["round"] for r in measured} | set(gpu_hours_by_round)):
        spent += gpu_hours_by_round.get(rnd, 0.0)
        best = ranking.best([r for r in measured if r["round"] <= rnd], standing)
        out.append({"round": rnd, "best_step_s": best[STEP_P50] if best else None, "gpu_hours": spent})
    return out


def _lineage(ledger: Ledger, name: str, gpus: int) -> list[Lineage]:
    cols = ["candidate_id", "sweep", STEP_P50, "m", "pred_bubble", *KNOB_COLUMNS]
    out = []
    for c in ledger.candidates(name):
        if c.edge_kind != EdgeKind.PROMOTED_FROM or c.parent_id is None:
            continue
        child = queries.compare(ledger, where=[f"candidate_id={c.id}"], columns=cols)
        parent = queries.compare(ledger, where=[f"candidate_id={c.parent_id}"], columns=cols)
        if not child or not parent:
            continue
        p, ch = parent[0], child[0]
        psweep = ledger.get_sweep(p["sweep"])
        out.append(
            Lineage(
                parent_sweep=p["sweep"],
                parent_gpus=_gpus(psweep) if psweep else 0,
                parent_step_s=p[STEP_P50],
                child_sweep=name,
                child_gpus=gpus,
                child_step_s=ch[STEP_P50],
                label=knobs.label(ch, before=p),
                parent_m=p["m"],
                child_m=ch["m"],
                parent_bubble=p["pred_bubble"],
                child_bubble=ch["pred_bubble"],
                candidate_id=c.id,
            )
        )
    return out
