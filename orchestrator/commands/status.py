"""`status NAME`: a sweep's candidates, their jobs and the measured best, from the ledger only."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from orchestrator.config import compose
from orchestrator.core import metrics
from orchestrator.core.errors import UserError
from orchestrator.core.metrics import STEP_P50
from orchestrator.core.states import EventKind, Fidelity
from orchestrator.report import path

if TYPE_CHECKING:  # the ledger and the driver are imported where used: `--help` stays light
    from orchestrator.ledger.leases import LeaseInfo

NAME = "status"
HELP = "Show a sweep's state from the ledger: counts, jobs, calibration, best so far, who holds the lease."


def add_arguments(parser) -> None:
    parser.add_argument("name", nargs="?", help="sweep name (omit to list sweeps)")
    parser.add_argument("--json", action="store_true")


def lease_view(info: LeaseInfo | None, *, at: datetime | None = None) -> dict | None:
    """Who holds the lease (holder `host:pid:start`), until when, and whether that process lives
    (orchestrator.ledger.leases'
    own liveness: True/False on this host, None for another host, where only the expiry tells)."""
    if info is None:
        return None
    at = at or datetime.now(UTC)
    host, _, rest = info.holder.partition(":")
    pid = rest.partition(":")[0]
    return {
        "holder": info.holder,
        "host": host,
        "pid": int(pid) if pid.isdigit() else None,
        "expires_at": info.expires_at,
        "expires_in_s": round((info.expires_at - at).total_seconds(), 1),
        "heartbeat_at": info.heartbeat_at,
        "alive": info.alive,
    }


def lease_line(lease: dict | None, last_event: str | None) -> str:
    if lease is None:
        return "lease: nobody drives this sweep" + (f" (last: {last_event})" if last_event else "")
    left = lease["expires_in_s"]
    rel = f"in {left:.0f} s" if left >= 0 else f"{-left:.0f} s ago"
    when = f"expires {lease['expires_at']:%H:%M:%S} UTC ({rel})"
    life = {True: "process alive", False: "process gone: `resume` takes over at once", None: "another host"}
    return f"lease: held by {lease['holder']} ({life[lease['alive']]}), {when}"


def gather(ledger, name: str) -> dict:
    from orchestrator import history
    from orchestrator.config import root_from_yaml
    from orchestrator.core.price import against

    sweep = ledger.get_sweep(name)
    if sweep is None:
        known = ", ".join(s.name for s in ledger.list_sweeps()) or "none"
        raise UserError(f"no sweep named '{name}' in {ledger.url}; sweeps: {known}")
    cfg = root_from_yaml(sweep.config_yaml)
    stage = cfg.required_stage()
    cands = ledger.candidates(name)
    spent = history.spent(ledger, name, stage=stage, probe_gpus=cfg.cluster.probe_gpus)
    cut_ids = history.cut_candidates(ledger, name)  # the launches the early cut stopped
    rows = []
    for c in cands:
        atts = ledger.attempts(c.id)
        a = atts[-1] if atts else None
        res = ledger.evidence.result(a.id) if a else None
        rows.append(
            {
                "round": c.round,
                "key": c.key,
                "layout": c.layout.short(),
                "status": c.status,
                "attempts": len(atts),
                "job_id": a.job_id if a else None,
                "state": a.state if a else None,
                "failure_class": a.failure_class if a else None,
                "cut": c.id in cut_ids,
                "edge": c.edge_kind,
                "pred_step_s": c.predicted.step_time_s or None,
                "decision": c.decision.to_dict() if c.decision.stored else None,
                STEP_P50: res.get(STEP_P50) if res else None,
            }
        )
    leases = [e for e in ledger.events(name, kind=EventKind.LEASE)]
    return {
        "sweep": name,
        "stage": sweep.stage,
        "model": sweep.model,
        "status": sweep.status,
        "counts": history.status_counts(cands),
        "runs": spent.runs,
        "attempts": spent.attempts,
        "gpu_hours": spent.gpu_hours,
        # every fidelity named, 0.0 where none ran (probe, screen, full, finalists)
        "gpu_hours_by_fidelity": {**{str(f): 0.0 for f in (*Fidelity, "finalists")}, **spent.by_fidelity},
        "cluster_hours": {
            "decision": spent.decision_hours,
            "cluster": spent.cluster_hours,
            "probe_pool": spent.probe_pool_hours,
            "cluster_gpus": stage.gpus,
            "probe_gpus": cfg.cluster.probe_gpus,
        },
        "simulated": spent.simulated,
        "price": (sweep.provenance or {}).get("price"),  # the whole sweep's simulated price, stored at its start
        "price_line": against(sweep.provenance, spent.gpu_hours),
        "cut_early": len(cut_ids),
        "probes": history.provenance_of(ledger, [sweep]).line(),
        "best": history.best_of(ledger, name),
        "gpu_capacity": history.capacity_view(ledger, name, cfg.hardware),
        "last_lease_event": leases[-1].message if leases else None,
        "lease": lease_view(ledger.leases.lease(name)),
        "calibrations": [
            {"round": c.round, **c.error, "method": c.fit.get("method")} for c in ledger.evidence.calibrations(name)
        ],
        "candidates": rows,
        "search_path": path.gather(ledger, name),
    }


def run(args, overrides) -> int:
    from orchestrator import history
    from orchestrator.ledger.ledger import Ledger

    if args.name and "=" in args.name:  # `status ledger.url=...`: an override, not a sweep name
        overrides, args.name = [args.name, *list(overrides)], None
    cfg = compose(overrides).cfg
    with Ledger.from_config(cfg.ledger) as ledger:
        if not args.name:
            sweeps = ledger.list_sweeps()
            for s in sweeps:
                print(f"{s.name:40s} stage {s.stage:6s} {s.status:12s} {s.updated_at:%Y-%m-%d %H:%M}")
            if not sweeps:
                print(f"no sweeps in {ledger.url}")
            return 0
        info = gather(ledger, args.name)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    sim = " (simulated)" if info["simulated"] else ""
    c = info["counts"]
    print(f"sweep {info['sweep']}  stage {info['stage']}  model {info['model']}  status {info['status']}")
    print(
        f"  queued {c['queued']}  running {c['running']}  done {c['done']}  failed {c['failed']}  "
        f"runs {info['runs']}  attempts {info['attempts']}  {info['gpu_hours']:.1f} GPU-hours{sim}"
        + history.fidelity_split(info["gpu_hours_by_fidelity"])
        + f"; {info['cluster_hours']['decision']:.1f} h to a decision on {info['cluster_hours']['cluster_gpus']} GPUs"
    )
    if info["price_line"]:
        print(f"  {info['price_line']}")
    print(f"  {lease_line(info['lease'], info['last_lease_event'])}")
    if info["cut_early"]:
        print(
            f"  cut early: {info['cut_early']} launch(es) slower than the best stopped after their first iterations"
            " (kept as screens of them)"
        )
    if info["gpu_capacity"] and info["gpu_capacity"]["line"]:
        print(f"  {info['gpu_capacity']['line']}")
    print(f"  {info['probes']}")
    for cal in info["calibrations"]:
        b, a = cal.get("step_mape_before"), cal.get("step_mape_after")
        print(
            f"  calibration round {cal['round']} ({cal['method']}): step MAPE "
            f"{'-' if b is None else f'{b:.1%}'} -> {'-' if a is None else f'{a:.1%}'}"
        )
    for r in info["candidates"]:
        meas = metrics.text(STEP_P50, r[STEP_P50])
        print(
            f"  r{r['round']} {r['status']:9s} job {r['job_id'] or '-':>10} {r['state'] or '-':10s} "
            f"{r['failure_class'] or ('cut early' if r['cut'] else ''):14s} {meas:>9} {r['layout']}"
        )
    if info["search_path"]:
        print("  search path (round, move, fidelity, predicted gain ± sd, outcome, step p50, layout):")
        for line in path.lines(info["search_path"]):
            print(line)
    if info["best"]:
        b = info["best"]
        print(f"  best (measured{sim}): {b['layout']}  step p50 {metrics.text(STEP_P50, b[STEP_P50])}")
    return 0
