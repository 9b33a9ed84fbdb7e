"""The report's sections as HTML fragments: the decision (headline, evidence, flags), the ranked table
sized for a 1400 px window, per-candidate details, and the calibration table in readable numbers.

Why the ranked table is narrow: the knobs every row shares go into its caption and the rest into one
layout cell; the secondary columns (p95, allocated memory, slowest rank, expert load, job) sit in a
collapsed details table, so the page never scrolls sideways at 1400 px.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core import knobs, metrics
from orchestrator.core.metrics import STEP_P50
from orchestrator.report.data import ReportData
from orchestrator.report.decision import Decision, eligible
from orchestrator.report.fmt import esc, fmt, pct, sig, table


def _m(*names: str) -> tuple[tuple[str, str], ...]:
    """(heading, key) columns of metrics, headed as the registry labels them (orchestrator/core/metrics.py)."""
    return tuple((metrics.heading(n), n) for n in names)


RANKED = (
    ("#", "rank"),
    ("cand.", "candidate_id"),
    ("round", "round"),
    ("layout", "layout"),
    ("D_a·D_e·m", "groups"),
    ("bubble", "pred_bubble"),
    *_m("step_p50_s", "step_p99_s"),
    ("Δ p50", "delta_vs_best"),
    *_m("tokens_per_s_per_gpu", "mfu", "q_effective"),
    ("peak GB", "peak_gb"),
    *_m("token_drop_fraction"),
    ("notes", "notes"),
)
DETAILS = (
    ("cand.", "candidate_id"),
    ("key", "key8"),
    *_m("step_p95_s", "step_mean_s", "peak_allocated_gb", "peak_reserved_gb", "heaviest_rank", "heaviest_pp_stage"),
    *_m("slowest_rank", "hot_expert_ratio", "expert_load_p50", "expert_load_p99", "padding_fraction"),
    *_m("ckpt_save_s", "ckpt_restore_s"),
    ("job", "job_id"),
    ("attempt", "attempt_no"),
)


def peak(r: dict) -> tuple[float | None, str]:
    """Heaviest-rank peak memory (orchestrator.core.metrics.peak_gb) and which figure it is."""
    return metrics.peak_gb(r), "reserved" if r.get("peak_reserved_gb") is not None else "allocated"


def split_labels(rows: Sequence[dict]) -> tuple[list[str], str]:
    """Each row's layout label without the pieces every row shares, and those shared pieces."""
    pieces = [knobs.label(r).split() for r in rows]
    common = [p for p in pieces[0] if all(p in other for other in pieces[1:])] if pieces else []
    return [" ".join(p for p in row if p not in common) or "(same)" for row in pieces], " ".join(common)


def _simulated(d: ReportData, r: dict) -> bool:
    return bool(r.get("simulated")) or d.simulated


def _bundle(dec: Decision) -> str:
    """What the recommended job ran with (orchestrator.evidence.bundle), folded under a one-line summary so the
    first screen still reaches the ranked table."""
    if dec.bundle is None:
        return ""
    rows = dec.bundle.rows()
    got = dict(rows)
    summary = f"Ran with Megatron {got['Megatron commit'].split(' ')[0][:12]} · TE {got['Transformer Engine']}"
    table = "".join(f"<tr><th>{esc(h)}</th><td>{esc(v)}</td></tr>" for h, v in rows)
    return f"<details id='bundle'><summary>{esc(summary)}</summary><table class='evidence'>{table}</table></details>"


def _interval(iv: tuple[float, float] | None) -> str:
    return "unknown" if iv is None else f"{fmt('s', iv[0])}–{fmt('s', iv[1])} s"


def _separation(dec: Decision) -> str:
    """Tie or not, from the two p50s' 95% intervals (Decision.within_noise): never a tie claimed without them."""
    ivs = f"p50 95% intervals {_interval(dec.best_interval)} and {_interval(dec.runner_interval)}"
    if dec.best_interval is None or dec.runner_interval is None:
        return f"<span class='note' id='tie'>Not enough stored step times to bound the p50s ({ivs}).</span>"
    if dec.within_noise:
        return f"<span class='warn' id='tie'>The {ivs} overlap: treat as a tie.</span>"
    return f"<span id='tie'>Separated: the {ivs} do not overlap.</span>"


def _parity(d: ReportData, dec: Decision, b: dict) -> str:
    """The recommended layout's correctness gate, plainly "NOT CHECKED" when no other layout was compared with it."""
    par = d.parity.get(b["candidate_id"])
    ref = str(par["reference_key"] or "") if par else ""
    if par is None or not ref or ref == b.get("key"):
        why = (par or {}).get("detail") or (
            dec.bundle.parity if dec.bundle is not None else "no parity run for this candidate"
        )
        # the gate off: say how to turn it on; the gate ran but had nothing to compare with: its reason is all
        hint = " Run its parity gate: parity.enabled=true (on by default but in +stage=smoke)." if par is None else ""
        return (
            "<span class='warn' id='parity-verdict'>NOT CHECKED: the recommended layout was never compared with a "
            f"reference layout ({esc(why)}).{hint}</span>"
        )
    text = ("passed" if par["passed"] else "FAILED") + f" against reference {ref[:8]}"
    if par.get("max_loss_diff") is not None:
        text += f", max loss diff {sig(par['max_loss_diff'])}"
    return f"<span id='parity-verdict'>{esc(text)}</span>"


def spend(d: ReportData) -> str:
    """Total spend (every fidelity and the finalists, as `status` charges it), rounds, budget, why it stopped."""
    s = d.spend
    if s is None:
        return ""
    sim = " simulated" if s.simulated else ""
    share = f" ({pct(s.gpu_hours / s.max_gpu_hours)})" if s.max_gpu_hours else ""
    split = ", ".join(f"{k} {v:,.1f}" for k, v in s.by_fidelity.items() if v)
    stop = s.stop or f"not stopped yet (status {s.status})"
    return (
        "<p class='note' id='spend'>"
        f"Spent <b>{s.gpu_hours:,.1f}{sim} GPU-hours</b> of the {s.max_gpu_hours:,.0f} budgeted{share}"
        f"{' (' + esc(split) + ')' if split else ''}; {s.runs} of {s.max_runs} runs, {s.rounds} of "
        f"{s.max_rounds} rounds. Stopped: {esc(stop)}."
        + (f" {esc(s.price[0].upper() + s.price[1:])}." if s.price else "")
        + "</p>"
    )


def headline(d: ReportData, dec: Decision) -> str:
    """The decision in one card: the layout, its margin, its evidence, then its exact Megatron flags."""
    b = dec.best
    if b is None:
        why = "no successful, complete measurement that passed parity" if d.measured or d.failed else "nothing measured"
        return (
            "<section id='decision' class='decision none'><div class='verdict'><div class='kicker'>No recommended "
            f"layout yet</div><p>{esc(why)}: run or resume the sweep.</p>{spend(d)}</div></section>"
        )
    sim = _simulated(d, b)
    badge = "<span class='badge sim'>SIMULATED</span>" if sim else "<span class='badge meas'>MEASURED</span>"
    ru = dec.runner_up
    if ru is None:
        margin = "The only eligible measured layout: no runner-up to compare."
    else:
        margin = (
            f"<b>{pct(dec.margin)} faster</b> step p50 than the runner-up, #{ru['candidate_id']} "
            f"<code>{esc(knobs.label(ru))}</code> ({fmt('s', ru[STEP_P50])} s vs {fmt('s', b[STEP_P50])} s)."
        )
        margin += " " + _separation(dec)
        if dec.p99_gain is not None:
            margin += (
                f" <span class='warn' id='p99-note'>The runner-up's p99 is {pct(dec.p99_gain)} lower "
                f"({fmt('s', ru.get('step_p99_s'))} s vs {fmt('s', b.get('step_p99_s'))} s): if the tail matters "
                f"more than the median (stragglers stall every rank), train with #{ru['candidate_id']}.</span>"
            )
    value, kind = peak(b)
    mem = "not measured" if value is None else f"{value:.1f} GB {kind}"
    if value is not None and dec.hbm_gb:
        mem += f" of {dec.hbm_gb:.0f} GB HBM ({100 * value / dec.hbm_gb:.0f}%), {dec.hbm_gb - value:.1f} GB headroom"
    if b.get("heaviest_rank") is not None:
        mem += f"; heaviest rank {b['heaviest_rank']}"
    drop = b.get("token_drop_fraction")
    drop_text = "not measured" if drop is None else "0 (no drops measured)" if drop == 0 else pct(drop, 2)
    parity = _parity(d, dec, b)
    source = (
        f"SIMULATED: twin workload ({esc(d.sweep.workload)}), not a measurement of Megatron on GPUs"
        if sim
        else f"measured on {d.gpus:,} GPUs, workload {esc(d.sweep.workload)}"
    )
    evidence = (
        ("step time", f"p50 {fmt('s', b[STEP_P50])} s · p99 {fmt('s', b.get('step_p99_s'))} s"),
        (
            "throughput",
            f"{fmt('t', b.get('tokens_per_s_per_gpu'))} tokens/s/GPU · MFU {fmt('mfu', b.get('mfu'))}",
        ),
        ("peak memory", esc(mem)),
        ("token drop", esc(drop_text)),
        ("parity", parity),
        (
            "evidence",
            f"{source}; candidate #{b['candidate_id']} round {b['round']}, job {esc(b.get('job_id'))} "
            f"attempt {esc(b.get('attempt_no'))}",
        ),
    )
    rows = "".join(f"<tr><th>{h}</th><td>{v}</td></tr>" for h, v in evidence)
    n_flags = sum(1 for line in dec.flags.splitlines() if line.lstrip().startswith("--"))
    flags = (
        f"<div class='flags-head'>Megatron flags ({n_flags}) <button type='button' id='copy-flags' "
        "onclick='copyFlags()'>Copy</button></div>"
        f"<pre id='flags'>{esc(dec.flags)}</pre><p class='note'>{esc(dec.flags_source)}.</p>"
        if dec.flags
        else f"<div class='flags-head'>Megatron flags</div><p class='note' id='flags-missing'>Not available: "
        f"{esc(dec.flags_source)}. `python -m orchestrator best --sweep {esc(d.sweep.name)}` shows the layout.</p>"
    )
    ran_with = _bundle(dec)
    return (
        "<section id='decision' class='decision'><div class='verdict'>"
        f"<div class='kicker'>Recommended layout {badge}</div>"
        f"<div class='layout' id='recommended-layout'>{esc(knobs.label(b))}</div>"
        f"<p id='margin'>{margin}</p><table class='evidence' id='evidence'>{rows}</table>{spend(d)}{ran_with}"
        f"<p class='note'>Chosen on {esc(dec.chosen_on)}, as <code>best</code> chooses; partial results and "
        "layouts that failed parity are out.</p></div>"
        f"<div class='flags'>{flags}</div></section>"
    )


def ranked(d: ReportData, dec: Decision) -> str:
    """The ranked table, narrow enough for 1400 px, and the per-candidate details collapsed below it."""
    labels, common = split_labels(d.measured)
    best_id = dec.best["candidate_id"] if dec.best else None
    base = dec.best[STEP_P50] if dec.best else None
    rows = []
    for i, (r, lab) in enumerate(zip(d.measured, labels, strict=True)):
        value, _ = peak(r)
        notes = [
            "recommended" if r["candidate_id"] == best_id else "",
            "parity failed" if r.get("parity") is False else "",
            "partial" if r.get("partial") else "",
            "simulated" if r.get("simulated") and not d.simulated else "",
        ]
        rows.append(
            dict(
                r,
                rank=i + 1,
                layout=lab,
                groups=f"{fmt('', r.get('d_a'))}·{fmt('', r.get('d_e'))}·{fmt('', r.get('m'))}",
                delta_vs_best=(r[STEP_P50] / base - 1.0) if base else None,
                peak_gb=None if value is None else f"{value:.1f}",
                notes=", ".join(n for n in notes if n) or "",
                key8=str(r.get("key", ""))[:8],
            )
        )
    head = (
        f"<h2>Measured candidates ({len(rows)})</h2><p class='note'>Ranked on measured step p50. "
        f"{'Every row shares <code>' + esc(common) + '</code>; the layout cell shows the rest. ' if common else ''}"
        "Δ p50 is relative to the recommended layout; peak GB is the heaviest rank's reserved memory; "
        f"Q_eff is throughput after checkpoint and restart costs. {esc(d.effective_note)}"
        f"{' Every row is SIMULATED (twin).' if d.simulated else ''}</p>"
    )
    main = table(
        rows,
        RANKED,
        table_id="ranked",
        left=("layout", "notes"),
        cls_of=lambda r: "best" if r["candidate_id"] == best_id else "" if eligible(r) else "excluded",
        title=lambda r: f"#{r['candidate_id']} {knobs.label(r)} key {r.get('key', '')}",
    )
    details = (
        "<details id='candidate-details'><summary>More per candidate: p95, allocated and reserved memory, "
        "slowest rank, expert load, checkpoint times, job</summary>"
        + table(rows, DETAILS, table_id="details", left=("key8",))
        + "</details>"
    )
    return head + main + details


def _mape_key(k: str) -> tuple[str, str] | None:
    """'step_mape_before' / 'mape_before' -> ('step', 'before'); 'loo_mape' -> ('step', 'loo')."""
    if "mape" not in k:
        return None
    what = "memory" if k.startswith("memory") else "step"
    return what, "loo" if "loo" in k else "before" if k.endswith("before") else "after" if k.endswith("after") else k


def _factors(name: str, v) -> str:
    if isinstance(v, dict):
        vals = [x for x in v.values() if isinstance(x, (int, float))]
        if vals and len({round(x, 6) for x in vals}) == 1:
            return f"×{sig(vals[0])} (all {len(vals)} {name})"
        return ", ".join(f"{k} ×{sig(x)}" if isinstance(x, (int, float)) else f"{k} {x}" for k, x in v.items())
    return f"×{sig(v)}" if isinstance(v, (int, float)) else str(v)


def _err_text(mape: dict[tuple[str, str], float], what: str) -> str:
    """'41.0% → 19.0% (leave-one-out 19.2%)' for the step-time or memory MAPEs of one fit."""
    if not any(w == what for w, _ in mape):
        return "–"
    text = f"{pct(mape.get((what, 'before')))} → {pct(mape.get((what, 'after')))}"
    return text + (f" (leave-one-out {pct(mape[(what, 'loo')])})" if (what, "loo") in mape else "")


MEMORY_FIT = ("memory_factor", "memory_method", "memory_factors", "memory_band")  # one cell: `_memory_fit`


def _memory_fit(fit: dict) -> str:
    """The memory calibration in words (search/calibrate.Fit): not fitted, one ratio for every peak, or a factor
    per memory term; then the band a calibrated peak is trusted within. Never the Fit's field names."""
    method = str(fit.get("memory_method") or ("ratio" if "memory_factor" in fit else "none"))
    band = fit.get("memory_band")
    within = f"; band ±{pct(band, 0)}" if isinstance(band, (int, float)) else ""
    if method.startswith("terms"):
        how = "per term" + (" and recompute set" if method == "terms+sets" else "")
        return f"{how}: {_factors('terms', dict(fit.get('memory_factors') or {}))}{within}"
    if method == "ratio":
        return f"one ratio ×{sig(fit.get('memory_factor'))}{within}"
    return f"not fitted{within}"


def calibration(d: ReportData) -> str:
    """One row per round: method, runs used, step-time and memory factors, errors before and after."""
    out = []
    for c in d.calibrations:
        fit, err = dict(c.get("fit") or {}), dict(c.get("error") or {})
        runs = ", ".join(f"{fit.pop(k)} {k[2:].replace('oom', 'OOM')}" for k in [k for k in fit if k.startswith("n_")])
        mape: dict[tuple[str, str], float] = {}
        for k, v in (*err.items(), *fit.items()):
            mk = _mape_key(k)
            if mk and isinstance(v, (int, float)):
                mape[mk] = v
        step, other = [], []
        memory = _memory_fit(fit) if any(k in fit for k in MEMORY_FIT) else "–"
        for k, v in fit.items():
            if _mape_key(k) or k == "method" or k in MEMORY_FIT:
                continue
            if "factor" in k:
                step.append(_factors("components", v))
            else:
                other.append(f"{k} {sig(v) if isinstance(v, float) else v}")

        out.append(
            {
                "round": c["round"],
                "method": fit.get("method", "–"),
                "runs": runs or "–",
                "step": "; ".join(step) or "–",
                "memory": memory,
                "step_err": _err_text(mape, "step"),
                "memory_err": _err_text(mape, "memory"),
                "other": "; ".join(other) or "–",
            }
        )
    cols = [
        ("round", "round"),
        ("method", "method"),
        ("runs used", "runs"),
        ("step-time factors (measured/predicted)", "step"),
        ("memory factors (measured/predicted)", "memory"),
        ("step-time MAPE before → after", "step_err"),
        ("memory MAPE before → after", "memory_err"),
    ]
    if any(r["other"] != "–" for r in out):
        cols.append(("other", "other"))
    return (
        "<h2>Calibration per round</h2><p class='note'>A factor multiplies the planner's prediction (×1 = the "
        "model was right); MAPE is the mean absolute error of the predictions against the measurements before "
        "and after calibrating.</p>" + table(out, cols, table_id="calibration", left=tuple(k for _, k in cols[1:]))
    )
