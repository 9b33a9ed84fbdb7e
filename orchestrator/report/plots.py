"""The report's figures (matplotlib, Agg backend). Each function takes ReportData and returns PNG bytes,
or None when the sweep has nothing to show for that figure (the page then says so instead)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from orchestrator.core import knobs, metrics  # noqa: E402
from orchestrator.core.stats import percentile  # noqa: E402
from orchestrator.report.data import ReportData, predicted_vs_measured  # noqa: E402

TOP = 5


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _label(r: dict) -> str:
    return f"#{r['candidate_id']} {knobs.label(r)}"


def _peak(r: dict) -> float | None:
    """Heaviest-rank peak (orchestrator.core.metrics.peak_gb), decimal GB."""
    return metrics.peak_gb(r)


def step_cdf(d: ReportData) -> bytes | None:
    """Step-time CDF of the top candidates, p50/p95/p99 marked: tails decide at scale, not means."""
    top = [r for r in d.measured[:TOP] if d.samples.get(r["candidate_id"])]
    if not top:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for r in top:
        xs = sorted(d.samples[r["candidate_id"]])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        (line,) = ax.step(xs, ys, where="post", label=_label(r))
        for q, mk in ((0.5, "o"), (0.95, "s"), (0.99, "^")):
            at = percentile(xs, 100 * q)  # xs is never empty here (top keeps candidates with samples)
            if at is not None:
                ax.plot(at, q, mk, color=line.get_color())
    ax.set_xlabel("step time (s), measurement window")
    ax.set_ylabel("CDF")
    ax.set_title("Step-time distribution (o p50, s p95, ^ p99)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _png(fig)


def pareto(d: ReportData) -> bytes | None:
    """tokens/s/GPU against heaviest-rank memory; the Pareto front (more throughput, less memory) highlighted."""
    pts = [
        (peak, r["tokens_per_s_per_gpu"], r["candidate_id"])
        for r in d.measured
        if r.get("tokens_per_s_per_gpu") and (peak := _peak(r)) and r.get("parity") is not False
    ]  # (peak GB, tokens/s/GPU, candidate): a layout that failed parity is out of the race
    if not pts:
        return None
    front, best_tps = [], -1.0
    for p in sorted(pts, key=lambda p: (p[0], -p[1])):
        if p[1] > best_tps:
            front.append(p)
            best_tps = p[1]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], c="#9aa5b1", label="measured")
    ax.plot([p[0] for p in front], [p[1] for p in front], "-o", c="#d1495b", label="Pareto front")
    for peak, tps, cid in front:
        ax.annotate(f"#{cid}", (peak, tps), fontsize=7)
    ax.set_xlabel("heaviest-rank peak memory, reserved (GB)")
    ax.set_ylabel("tokens/s/GPU")
    ax.set_title("Throughput vs memory")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def calibration(d: ReportData) -> bytes | None:
    """Predicted against measured step time and memory (`calibration_figure`) as PNG."""
    fig = calibration_figure(d)
    return None if fig is None else _png(fig)


def calibration_figure(d: ReportData):
    """Predicted against measured step time and memory, coloured by round: the UNcalibrated planner (filled)
    is the model's honest error; the calibrated prediction at planning time (hollow) shows what calibration
    bought (it is fitted on earlier measurements, so it sits nearer the diagonal by construction). Axis labels
    are short and ticks few (issue 49: the long labels of the two panels printed over each other)."""
    pts = [p for p in predicted_vs_measured(d.measured) if p["step_s"] and (p["raw_step_s"] or p["cal_step_s"])]
    if not pts:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    rounds = sorted({p["round"] for p in pts})
    cmap = plt.get_cmap("viridis", max(len(rounds), 2))
    for ax, what in ((a1, "step"), (a2, "memory")):
        meas = "step_s" if what == "step" else "memory_gb"
        for i, rnd in enumerate(rounds):
            rr = [p for p in pts if p["round"] == rnd and p[meas]]
            raw = [p for p in rr if p[f"raw_{meas}"]]
            ax.scatter(
                [p[f"raw_{meas}"] for p in raw],
                [p[meas] for p in raw],
                color=cmap(i),
                label=f"round {rnd} uncalibrated",
            )
            cal = [p for p in rr if p[f"cal_{meas}"] and p[f"cal_{meas}"] != p[f"raw_{meas}"]]
            ax.scatter(
                [p[f"cal_{meas}"] for p in cal],
                [p[meas] for p in cal],
                facecolors="none",
                edgecolors=cmap(i),
                label=f"round {rnd} calibrated" if cal else None,
            )
    for ax, what in ((a1, "step time (s)"), (a2, "peak memory (GB)")):
        lim = [min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])]
        ax.plot(lim, lim, "--", c="grey", lw=1)
        ax.set_xlabel(f"predicted {what}")
        ax.set_ylabel(f"measured {what}")
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    a1.set_title("Step time: predicted vs measured")
    a2.set_title("Heaviest-rank memory: predicted vs measured")
    fig.suptitle("filled: the uncalibrated planner; hollow: calibrated at planning time", fontsize=8, y=0.02)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def rounds(d: ReportData) -> bytes | None:
    """Best measured step so far per round, and cumulative GPU-hours spent: every attempt of every fidelity
    (probe, screen, full) and the finalists, the figure `status` charges (ReportData.rounds, history.spent)."""
    if not d.rounds:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    xs = [r["round"] for r in d.rounds]
    ax.plot(xs, [r["best_step_s"] for r in d.rounds], "-o", c="#00798c", label="best step p50 so far")
    ax.set_xlabel("round")
    ax.set_ylabel("best step time (s)")
    ax2 = ax.twinx()
    ax2.bar(
        xs,
        [r["gpu_hours"] for r in d.rounds],
        alpha=0.25,
        color="#edae49",
        label="GPU-hours, every fidelity (cumulative)",
    )
    ax2.set_ylabel("GPU-hours, all fidelities" + (" (simulated)" if d.simulated else ""))
    ax.set_xticks(xs)
    ax.set_title("Progress per round")
    ax.grid(alpha=0.3)
    return _png(fig)


def scaling(d: ReportData) -> bytes | None:
    """Strong-scaling efficiency of promoted lineages (`scaling_figure`) as PNG."""
    fig = scaling_figure(d)
    return None if fig is None else _png(fig)


def scaling_figure(d: ReportData):
    """Strong-scaling efficiency of promoted lineages, with m and bubble before/after. Each bar is labelled by
    its candidate number (`#12`), as the expert-load figure's are; the "Promoted lineages" table beside it
    gives each number's layout (long rotated layout strings did not fit under a bar)."""
    rows = [l for l in d.lineage if l.efficiency is not None]
    if not rows:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [short_label(l) for l in rows]
    a1.bar(range(len(rows)), [l.efficiency for l in rows], color="#30638e")
    a1.set_xticks(range(len(rows)), labels, fontsize=8)
    a1.set_ylabel("strong-scaling efficiency")
    a1.set_title(f"{rows[0].parent_gpus} -> {rows[0].child_gpus} GPUs, same B")
    a2.plot([l.parent_m or 0 for l in rows], [l.parent_bubble or 0 for l in rows], "o", label="earlier stage")
    a2.plot([l.child_m or 0 for l in rows], [l.child_bubble or 0 for l in rows], "s", label="this stage")
    a2.set_xlabel("m (microbatches per update)")
    a2.set_ylabel("bubble (p-1)/(m+p-1)")
    a2.legend(fontsize=7)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    return fig


def short_label(line) -> str:
    """A lineage's label on the scaling figure and in its table: the promoted candidate's number."""
    return f"#{line.candidate_id}" if line.candidate_id is not None else line.label


def expert_load(d: ReportData) -> bytes | None:
    """Tokens per expert (p50/p95/p99 across experts), hot-expert ratio and token drop per finalist."""
    top = [r for r in d.measured[:TOP] if r.get("expert_load_p50") is not None]
    if not top:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    xs = range(len(top))
    w = 0.27
    for i, (k, lab) in enumerate((("expert_load_p50", "p50"), ("expert_load_p95", "p95"), ("expert_load_p99", "p99"))):
        a1.bar([x + (i - 1) * w for x in xs], [r.get(k) or 0 for r in top], w, label=lab)
    a1.set_xticks(list(xs), [f"#{r['candidate_id']}" for r in top])
    a1.set_ylabel("tokens per expert")
    a1.set_title("Expert load across experts")
    a1.legend(fontsize=7)
    drops = any(r.get("token_drop_fraction") for r in top)  # an all-zero axis says nothing: the page notes it
    a2.bar(
        [x - 0.2 * drops for x in xs],
        [r.get("hot_expert_ratio") or 0 for r in top],
        0.4,
        label="hot-expert ratio (max/mean)",
    )
    a2.set_xticks(list(xs), [f"#{r['candidate_id']}" for r in top])
    a2.set_ylabel("max / mean")
    if drops:
        a2b = a2.twinx()
        a2b.bar(
            [x + 0.2 for x in xs],
            [100 * (r.get("token_drop_fraction") or 0) for r in top],
            0.4,
            color="#d1495b",
            label="token drop (%)",
        )
        a2b.set_ylabel("token drop (%)")
        a2.set_title("Hot experts and token drop")
    else:
        a2.set_title("Hot experts (no token drops measured)")
    return _png(fig)


FIGURES = (
    ("step-cdf", "Step-time distribution of the top candidates", step_cdf),
    ("pareto", "Throughput against heaviest-rank memory", pareto),
    ("calibration", "Predicted against measured, per round", calibration),
    ("rounds", "Best so far and GPU-hours per round", rounds),
    ("scaling", "Across stages: strong scaling of promoted lineages", scaling),
    ("expert-load", "Expert load and token drop per finalist", expert_load),
)
