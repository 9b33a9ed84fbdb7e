"""Finalists: the correctness gate (parity vs a reference layout) and the long-run window (Q_effective).

Why separate from the sweep loop: both run extra jobs for a few measured candidates, outside the
search budget's rounds, and record their verdicts in the ledger; the loop decides WHEN (see
DESIGN/README), this module only knows HOW. Jobs go through the same launcher, job folders and
`collect` as any attempt, but are not ledger attempts: they must not become a candidate's latest
result. Their job ids and folders are logged as events as soon as they are submitted.

- run_parity: candidate and reference (the candidate's layout with `parity.reference` overrides, CP1 by
  default) run `parity.steps` iterations from the same seed; lm loss and grad norm must agree within
  the explicit tolerance. A failing candidate is `excluded` (orchestrator.ledger.queries.best skips failing parity).
- run_long_run: save at X then exit, restore and train on (runspec.long_run_specs); the measured save /
  restore seconds and post-restart tokens/s give Q_effective, stored on the candidate's result row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator import runspec
from orchestrator.core.paths import JobPaths
from orchestrator.core.result import JobResult
from orchestrator.core.schema import RootConfig
from orchestrator.core.spec import JobSpec
from orchestrator.evidence import parity as parity_mod
from orchestrator.evidence.collect import collect
from orchestrator.evidence.effective import effective_throughput
from orchestrator.job.entry import run_task
from orchestrator.launch import JobState, LaunchTask
from orchestrator.ledger.ledger import CandidateRow, Ledger, ParityRow
from orchestrator.plan import planner
from orchestrator.plan.layout import Layout
from orchestrator.sweep.retry import retry_decision

RETRY_ONCE = True  # a parity / long-run job lost to a retryable failure (NODE_FAIL ...) is resubmitted once
OnPoll = Callable[[], None] | None  # called before every poll: the sweep loop's lease heartbeat


# ------------------------------------------------------------------------------------------- jobs
def run_jobs(
    cfg: RootConfig,
    ledger: Ledger,
    launcher,
    sweep: str,
    specs: Sequence[JobSpec],
    *,
    kind: str,
    candidate_id: int | None = None,
    on_poll: OnPoll = None,
) -> list[JobResult]:
    """Submit every spec at once, poll until all are terminal, collect each folder (in order).
    A retryable failure is resubmitted once. `on_poll` runs before each poll (a heartbeat; it may raise
    to stop waiting)."""
    results: list[JobResult | None] = [None] * len(specs)
    retry_classes = cfg.policy.retry_classes
    todo = list(range(len(specs)))
    for round_no in range(2 if RETRY_ONCE else 1):
        if not todo:
            break
        tasks = []
        for i in todo:
            spec = specs[i]
            spec.save(JobPaths(spec.job_dir).spec)
            tasks.append(
                LaunchTask(
                    fn=run_task,
                    args=(spec,),
                    n_gpus=spec.n_gpus,
                    gpus_per_node=spec.gpus_per_node,
                    name=f"{sweep}:{kind}:{spec.candidate_key[:8]}",
                    folder=spec.job_dir,
                    time_min=runspec.time_limit_min(spec, cfg.cluster),
                )
            )
        subs = launcher.submit(tasks)
        ids = {i: str(s.job_id) for i, s in zip(todo, subs)}
        ledger.log_event(
            sweep,
            f"{kind}-submitted",
            f"{kind}: {len(subs)} job(s) " + ", ".join(ids.values()),
            candidate_id=candidate_id,
            data={"jobs": [{"job_id": ids[i], "job_dir": specs[i].job_dir, "role": specs[i].role} for i in todo]},
        )
        states = _wait(launcher, list(ids.values()), float(cfg.cluster.poll_interval_s), on_poll)
        retry = []
        for i in todo:
            st = states[ids[i]]
            res = collect(specs[i].job_dir, slurm_state=st.state, exit_code=st.exit_code, job_id=ids[i])
            results[i] = res
            _charge(cfg, ledger, sweep, specs[i], res, ids[i], candidate_id)
            again = retry_decision(res.failure_class, [res.failure_class], max_attempts=2, retry_classes=retry_classes)
            if not res.ok and round_no == 0 and again[0]:
                retry.append(i)
        todo = retry
    return [r for r in results if r is not None]


def _charge(cfg: RootConfig, ledger: Ledger, sweep: str, spec: JobSpec, res: JobResult, job_id: str, cid) -> None:
    """A finalist job's GPU-hours (start-up + the iterations it ran x its mean step) into the ledger, where
    observe.spent adds them to the sweep's budget."""
    iters = (res.warmup_iters or 0) + (res.measure_iters or 0)
    gpu_h = spec.n_gpus * (cfg.required_stage().budget.startup_s + (res.step_mean_s or 0.0) * iters) / 3600.0
    ledger.log_event(
        sweep,
        "finalist-cost",
        f"{spec.role} job {job_id}: {gpu_h:.2f} GPU-hours",
        candidate_id=cid,
        data={"job_id": job_id, "role": spec.role, "gpu_hours": gpu_h},
    )


def _wait(launcher, job_ids: list[str], poll_s: float, on_poll: OnPoll = None) -> dict[str, JobState]:
    """Poll (one call for all) until every job is terminal."""
    while True:
        if on_poll is not None:
            on_poll()
        states = launcher.poll(job_ids)
        if all(states[j].terminal for j in job_ids):
            return states
        time.sleep(poll_s)


def _planned(cfg: RootConfig, layout: Layout, key: str | None = None):
    """The planner's verdict on `layout` in this stage: (Planned, "") or (None, why not)."""
    out = planner.evaluate(cfg.model, cfg.hardware, cfg.required_stage(), layout, workload=cfg.workload.name)
    if not isinstance(out, planner.Planned):
        return None, "breaks " + ", ".join(out.rule_ids)
    if not out.prediction.feasible:
        return None, f"predicted {out.prediction.memory_gb:.1f} GB does not fit {cfg.hardware.hbm_gb:g} GB"
    return (planner.Planned(out.layout, out.prediction, key=key) if key else out), ""


def _folder(cfg: RootConfig, sweep: str, key: str, name: str) -> Path:
    """`<cluster.folder>/<sweep>/<key>/<name>/` beside the candidate's attempt folders."""
    return runspec.attempt_dir(cfg, sweep, key, 0).parent / name


# ----------------------------------------------------------------------------------------- parity
def reference_layout(cfg: RootConfig, layout: Layout) -> Layout:
    """The candidate's layout with `parity.reference` knobs overridden (CP1 by default)."""
    return Layout.from_dict({**layout.to_dict(), **dict(cfg.parity.reference)})


def run_parity(
    cfg: RootConfig, ledger: Ledger, launcher, sweep: str, candidates: Sequence[CandidateRow], *, on_poll: OnPoll = None
) -> list[ParityRow]:
    """The correctness gate for `candidates`: one parity row each (in order). Candidates and their
    references run together (one reference per distinct reference layout); a failing candidate is set to
    `excluded` with the reason."""
    p = cfg.parity
    rows: dict[int, ParityRow] = {}
    cand_specs: dict[int, JobSpec] = {}
    ref_specs: dict[str, JobSpec] = {}
    ref_of: dict[int, str] = {}
    for c in candidates:
        lay = Layout.from_dict(c.layout)
        ref = reference_layout(cfg, lay)
        if ref == lay:
            rows[c.id] = ledger.record_parity(
                c.id,
                reference_key=c.key,
                steps=0,
                max_loss_diff=0.0,
                max_grad_norm_diff=0.0,
                tolerance=p.loss_rtol,
                passed=True,
                detail=f"{lay.short()} is the reference layout itself",
            )
            continue
        mine, why = _planned(cfg, lay, key=c.key)
        ref_planned, ref_why = _planned(cfg, ref)
        if mine is None or ref_planned is None:
            detail = (
                f"candidate {lay.short()} {why}"
                if mine is None
                else f"reference {ref.short()} {ref_why}: no reference to compare with"
            )
            rows[c.id] = _verdict(ledger, c, ref_planned.key if ref_planned else "", None, detail, p.loss_rtol)
            continue
        n = len(ledger.parity(c.id)) + 1
        cand_specs[c.id] = runspec.parity_spec(
            cfg, mine, sweep=sweep, attempt=n, job_dir=_folder(cfg, sweep, c.key, f"parity-{n}")
        )
        ref_of[c.id] = ref_planned.key
        if ref_planned.key not in ref_specs:
            ref_specs[ref_planned.key] = runspec.parity_spec(
                cfg,
                ref_planned,
                sweep=sweep,
                attempt=n,
                job_dir=_folder(cfg, sweep, ref_planned.key, f"parity-reference-{c.key[:10]}-{n}"),
            )
    specs = list(cand_specs.values()) + list(ref_specs.values())
    if specs:
        results = run_jobs(cfg, ledger, launcher, sweep, specs, kind="parity", on_poll=on_poll)
        by_dir = {s.job_dir: r for s, r in zip(specs, results)}
        for cid, spec in cand_specs.items():
            c = next(x for x in candidates if x.id == cid)
            ref_spec = ref_specs[ref_of[cid]]
            rows[cid] = _compare(ledger, c, ref_of[cid], by_dir[spec.job_dir], by_dir[ref_spec.job_dir], cfg)
    return [rows[c.id] for c in candidates]


def _compare(
    ledger: Ledger, c: CandidateRow, ref_key: str, mine: JobResult, ref: JobResult, cfg: RootConfig
) -> ParityRow:
    p = cfg.parity
    for who, r in (("candidate", mine), ("reference", ref)):
        if not r.ok:
            return _verdict(
                ledger,
                c,
                ref_key,
                None,
                f"{who} run failed: {r.failure_class or '?'} {r.failure_detail}".strip(),
                p.loss_rtol,
            )
    verdict = parity_mod.compare(
        mine.lm_loss,
        ref.lm_loss,
        mine.grad_norm,
        ref.grad_norm,
        steps=p.steps,
        loss_rtol=p.loss_rtol,
        grad_norm_rtol=p.grad_norm_rtol,
    )
    return _verdict(ledger, c, ref_key, verdict, verdict.detail, p.loss_rtol)


def _verdict(
    ledger: Ledger, c: CandidateRow, ref_key: str, verdict: parity_mod.Parity | None, detail: str, tolerance: float
) -> ParityRow:
    """Record the parity row (no verdict = failed: no promotion without evidence) and exclude on failure."""
    passed = bool(verdict and verdict.passed)
    row = ledger.record_parity(
        c.id,
        reference_key=ref_key,
        steps=verdict.steps if verdict else 0,
        max_loss_diff=verdict.max_loss_diff if verdict else None,
        max_grad_norm_diff=verdict.max_grad_norm_diff if verdict else None,
        tolerance=tolerance,
        passed=passed,
        detail=detail,
    )
    # record_parity already logged the "parity" event (verdict and detail) in the same transaction
    if not passed:
        ledger.set_candidate_status(c.id, "excluded", f"parity failed: {detail}")
    return row


# --------------------------------------------------------------------------------------- long run
def run_long_run(
    cfg: RootConfig, ledger: Ledger, launcher, sweep: str, candidate: CandidateRow, *, on_poll: OnPoll = None
) -> dict:
    """Save at X, restart, restore, train on; store the measured figures on the candidate's latest result.

    Q_effective = steady tokens/s (the candidate's measured result) x effective fraction, with the save
    and restore seconds this window measured. Returns what was stored plus `ok` / `reason`."""
    c = candidate
    lay = Layout.from_dict(c.layout)
    measured = next((m for m in ledger.measured(sweep=sweep) if m.candidate_id == c.id), None)
    if measured is None:
        return _long_run_done(ledger, sweep, c, {"ok": False, "reason": "no measured result to attach the window to"})
    planned, why = _planned(cfg, lay, key=c.key)
    if planned is None:
        return _long_run_done(ledger, sweep, c, {"ok": False, "reason": f"{lay.short()} {why}"})
    n = sum(1 for e in ledger.events(sweep, kind="long-run", candidate_id=c.id)) + 1
    folder = _folder(cfg, sweep, c.key, f"long-run-{n}")
    save_spec, restore_spec = runspec.long_run_specs(
        cfg, planned, sweep=sweep, attempt=n, ckpt_dir=folder / "ckpt", folder=folder
    )
    (save,) = run_jobs(cfg, ledger, launcher, sweep, [save_spec], kind="long-run", candidate_id=c.id, on_poll=on_poll)
    if not save.ok or save.ckpt_save_s is None:
        return _long_run_done(
            ledger,
            sweep,
            c,
            {
                "ok": False,
                "reason": f"save job failed: {save.failure_class} {save.failure_detail}".strip(),
                "folder": str(folder),
            },
        )
    (restore,) = run_jobs(
        cfg, ledger, launcher, sweep, [restore_spec], kind="long-run", candidate_id=c.id, on_poll=on_poll
    )
    if not restore.ok or restore.ckpt_restore_s is None:
        why = f"failed: {restore.failure_class} {restore.failure_detail}" if not restore.ok else "logged no load time"
        return _long_run_done(
            ledger, sweep, c, {"ok": False, "reason": f"restore job {why}".strip(), "folder": str(folder)}
        )
    steady = measured.metrics.get("tokens_per_s") or save.tokens_per_s
    if steady is None:
        return _long_run_done(ledger, sweep, c, {"ok": False, "reason": "no tokens/s measured", "folder": str(folder)})
    eff = cfg.effective
    e = effective_throughput(
        steady,
        n_gpus=cfg.required_stage().gpus,
        save_s=save.ckpt_save_s,
        restore_s=restore.ckpt_restore_s,
        checkpoint_interval_s=eff.checkpoint_interval_s,
        interruption_rate_per_gpu_hour=eff.interruption_rate_per_gpu_hour,
        restart_overhead_s=eff.restart_overhead_s,
    )
    values = {
        "ckpt_save_s": save.ckpt_save_s,
        "ckpt_restore_s": restore.ckpt_restore_s,
        "tokens_per_s_after_restart": restore.tokens_per_s_after_restart,
        "effective_fraction": e.effective_fraction,
        "q_effective": e.q_effective,
    }
    ledger.update_result_metrics(measured.attempt_id, **values)
    return _long_run_done(
        ledger,
        sweep,
        c,
        {
            "ok": True,
            "reason": "",
            "attempt_id": measured.attempt_id,
            "tokens_per_s": steady,
            **values,
            "folder": str(folder),
            "interruptions_per_day": e.interruptions_per_day,
        },
    )


def _long_run_done(ledger: Ledger, sweep: str, c: CandidateRow, info: dict) -> dict:
    lay = Layout.from_dict(c.layout).short()
    if info["ok"]:
        msg = (
            f"{lay}: save {info['ckpt_save_s']:.2f}s, restore {info['ckpt_restore_s']:.2f}s, "
            f"{info['tokens_per_s_after_restart'] or 0:,.0f} tok/s after restart, "
            f"Q_effective {info['q_effective']:,.0f} tok/s ({info['effective_fraction']:.1%})"
        )
    else:
        msg = f"{lay}: no long-run figures: {info['reason']}"
    ledger.log_event(sweep, "long-run", msg, candidate_id=c.id, data=info)
    return info


# --------------------------------------------------------------------------------------- together
def pick(ledger: Ledger, sweep: str, k: int) -> list[CandidateRow]:
    """The k fastest measured candidates (non-partial step p50, never excluded): the finalists."""
    rows = [
        m
        for m in ledger.measured(sweep=sweep)
        if m.status != "excluded" and not m.partial and m.metrics.get("step_p50_s") is not None
    ]
    rows.sort(key=lambda m: (m.metrics["step_p50_s"], m.metrics.get("step_p99_s") or 0.0, m.candidate_id))
    by_id = {c.id: c for c in ledger.candidates(sweep)}
    return [by_id[m.candidate_id] for m in rows[: max(0, k)]]


def run_finalists(
    cfg: RootConfig, ledger: Ledger, launcher, sweep: str, k: int | None = None, *, on_poll: OnPoll = None
) -> dict:
    """What the sweep loop calls once its search has stopped: the top k (policy.promote_top_k) measured
    candidates go through the correctness gate (parity.enabled), and those that pass through the long-run
    window (effective.long_run). Idempotent: a candidate with a parity row, or a result that already has
    ckpt_save_s, is not run again (a resumed sweep does not repeat them)."""
    k = cfg.policy.promote_top_k if k is None else k
    chosen = pick(ledger, sweep, k)
    out: dict = {"finalists": [c.key for c in chosen], "parity": {}, "long_run": {}}
    if cfg.parity.enabled:
        fresh = [c for c in chosen if not ledger.parity(c.id)]
        for row in run_parity(cfg, ledger, launcher, sweep, fresh, on_poll=on_poll):
            out["parity"][row.candidate_id] = row.passed
        chosen = [c for c in chosen if all(p.passed for p in ledger.parity(c.id))]
    if cfg.effective.long_run:
        measured = {m.candidate_id: m for m in ledger.measured(sweep=sweep)}
        for c in chosen:
            if measured[c.id].metrics.get("ckpt_save_s") is None:
                out["long_run"][c.id] = run_long_run(cfg, ledger, launcher, sweep, c, on_poll=on_poll)
    return out
