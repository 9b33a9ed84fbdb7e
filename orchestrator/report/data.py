"""Gather everything the report shows from the ledger, in one pass, into plain dataclasses.

Why a separate step: plots and HTML then work on plain data (testable without a database), and the
ledger is read once. Effective throughput is computed here with orchestrator.evidence.effective from the measured
save/restore times (or the configured defaults, flagged as such).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from orchestrator.core import knobs
from orchestrator.core.schema import EffectiveConfig
from orchestrator.core.states import CandidateStatus, EdgeKind
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
    "step_p50_s",
    "step_p95_s",
    "step_p99_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "heaviest_rank",
    "heaviest_pp_stage",
    "peak_allocated_gb",
    "peak_reserved_gb",
    "slowest_rank",
    "token_drop_fraction",
    "padding_fraction",
    "expert_load_p50",
    "expert_load_p95",
    "expert_load_p99",
    "hot_expert_ratio",
    "pred_step_time_s",
    "pred_memory_gb",
    "partial",
    "simulated",
    "ckpt_save_s",
    "ckpt_restore_s",
    "job_id",
    "attempt_no",
    "measure_iters",
    "warmup_iters",
    "step_mean_s",
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

    @property
    def efficiency(self) -> float | None:
        """Strong-scaling efficiency = (T_small x N_small) / (T_big x N_big) at the same global batch."""
        if not self.parent_step_s or not self.child_step_s:
            return None
        return (self.parent_step_s * self.parent_gpus) / (self.child_step_s * self.child_gpus)


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
    rows = queries.compare(ledger, sweep=name, columns=list(TABLE_COLUMNS), sort="step_p50_s")
    measured = [
        _with_effective(r, gpus, eff)
        for r in rows
        # full-window results only: a screen ranks and a fit probe answers "does it fit?"; neither is a measurement
        # the report compares, plots against its prediction or calls the best
        if r["step_p50_s"] is not None and r["status"] == CandidateStatus.DONE and r.get("fidelity", "full") == "full"
    ]
    failed = [r for r in rows if r["failure_class"]]
    parity = {}
    for r in measured:
        checks = ledger.parity(r["candidate_id"])
        if checks:
            last = checks[-1]
            parity[r["candidate_id"]] = {
                "passed": last.passed,
                "detail": last.detail,
                "max_loss_diff": last.max_loss_diff,
                "reference_key": last.reference_key,
            }
    best = next((r for r in measured if parity.get(r["candidate_id"], {}).get("passed", True)), None)
    for r in measured:
        r["parity"] = parity.get(r["candidate_id"], {}).get("passed")
        r["delta_vs_best"] = (r["step_p50_s"] / best["step_p50_s"] - 1.0) if best else None

    attempts = {r["candidate_id"]: r["attempt_no"] for r in measured}
    samples: dict[int, list[float]] = {}
    cands = ledger.candidates(name)
    cand_attempt = {c.id: c.latest_attempt_id for c in cands}
    predicted = {c.id: c.predicted or {} for c in cands}
    for r in measured:
        r.update(raw_predictions(predicted.get(r["candidate_id"], {})))
    for cid in attempts:
        aid = cand_attempt.get(cid)
        if aid is not None:
            samples[cid] = [s[1] for s in ledger.step_samples(aid) if s[1] is not None]

    rounds = _rounds(measured, gpus)
    lineage = _lineage(ledger, name, gpus)
    cal = [{"round": c.round, "fit": c.fit, "error": c.error} for c in ledger.calibrations(name)]
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
        provenance=sweep.provenance or {},
        effective_note=note,
        search_path=path.gather(ledger, name),
    )


def raw_predictions(predicted: dict) -> dict:
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
                "step_s": r.get("step_p50_s"),
                "raw_memory_gb": r.get("raw_pred_memory_gb"),
                "cal_memory_gb": r.get("pred_memory_gb"),
                "memory_gb": r.get("peak_reserved_gb") or r.get("peak_allocated_gb"),
            }
        )
    return out


def _rounds(measured: list[dict], gpus: int) -> list[dict]:
    """Best measured step time so far and GPU-hours spent, per round (GPU-hours from the measured steps)."""
    out, best, spent = [], None, 0.0
    for rnd in sorted({r["round"] for r in measured}):
        for r in (x for x in measured if x["round"] == rnd):
            iters = (r.get("warmup_iters") or 0) + (r.get("measure_iters") or 0)
            spent += gpus * iters * (r.get("step_mean_s") or r["step_p50_s"]) / 3600.0
            best = r["step_p50_s"] if best is None else min(best, r["step_p50_s"])
        out.append({"round": rnd, "best_step_s": best, "gpu_hours": spent})
    return out


def _lineage(ledger: Ledger, name: str, gpus: int) -> list[Lineage]:
    cols = ["candidate_id", "sweep", "step_p50_s", "m", "pred_bubble", *KNOB_COLUMNS]
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
                parent_step_s=p["step_p50_s"],
                child_sweep=name,
                child_gpus=gpus,
                child_step_s=ch["step_p50_s"],
                label=knobs.label(ch, before=p),
                parent_m=p["m"],
                child_m=ch["m"],
                parent_bubble=p["pred_bubble"],
                child_bubble=ch["pred_bubble"],
            )
        )
    return out
