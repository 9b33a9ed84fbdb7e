"""Write the report page: one self-contained HTML file (figures embedded as PNG data URIs, and also
written beside it), every value escaped. Simulated rows are labelled on the page and in the table."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from jobs.paths import atomic_write
from orchestrator import knobs
from orchestrator.errors import UserError
from orchestrator.report import path, plots
from orchestrator.report.data import KNOB_COLUMNS, ReportData

RANKED_HEAD = (("rank", "rank"), ("candidate", "candidate_id"), ("round", "round"))
RANKED = (  # after RANKED_HEAD and the knob columns (knob_columns)
    ("D_a", "d_a"),
    ("D_e", "d_e"),
    ("m", "m"),
    ("bubble", "pred_bubble"),
    ("step p50 (s)", "step_p50_s"),
    ("p95", "step_p95_s"),
    ("p99", "step_p99_s"),
    ("Δ vs best", "delta_vs_best"),
    ("tokens/s/GPU", "tokens_per_s_per_gpu"),
    ("MFU", "mfu"),
    ("Q_effective (tok/s)", "q_effective"),
    ("heaviest rank", "heaviest_rank"),
    ("peak alloc (GB)", "peak_allocated_gb"),
    ("peak reserved (GB)", "peak_reserved_gb"),
    ("slowest rank", "slowest_rank"),
    ("token drop", "token_drop_fraction"),
    ("hot-expert ratio", "hot_expert_ratio"),
    ("parity", "parity"),
    ("partial", "partial"),
    ("simulated", "simulated"),
    ("job", "job_id"),
)
PCT = {"pred_bubble", "delta_vs_best", "mfu", "token_drop_fraction"}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1f2933;max-width:1400px}
h1{margin-bottom:4px} .sub{color:#52606d;margin-top:0}
.sim{background:#fff3c4;border:1px solid #f0b429;padding:8px 12px;border-radius:6px;font-weight:600}
table{border-collapse:collapse;font-size:12px;margin:8px 0 20px}
th,td{border:1px solid #d9e2ec;padding:3px 6px;text-align:right}
th{background:#f0f4f8;position:sticky;top:0} td.l,th.l{text-align:left} tr.best td{background:#e3f8ec}
tr.excluded td{color:#9aa5b1;text-decoration:line-through}
figure{margin:12px 0 28px} figcaption{font-weight:600;margin-bottom:6px}
.note{color:#52606d;font-size:12px} code{background:#f0f4f8;padding:1px 4px;border-radius:3px}
"""


def _fmt(key: str, v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key in PCT and isinstance(v, (int, float)):
        return f"{100 * v:+.1f}%" if key == "delta_vs_best" else f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 0.01 else f"{v:.3f}"
    return str(v)


def knob_columns(rows: Sequence[dict]) -> tuple[tuple[str, str], ...]:
    """A column per shown knob (orchestrator/knobs.py), and per other knob whose value differs between rows."""
    varying = [c for c in KNOB_COLUMNS if len({knobs.text(r.get(c)) for r in rows}) > 1]
    return tuple((c, c) for c in knobs.columns(varying))


def _table(rows: Sequence[dict], cols: Sequence[tuple], cls_of=None, table_id: str = "") -> str:
    head = "".join(
        f'<th class="l">{html.escape(h)}</th>' if i < 1 else f"<th>{html.escape(h)}</th>"
        for i, (h, _) in enumerate(cols)
    )
    body = []
    for r in rows:
        cls = cls_of(r) if cls_of else ""
        tds = "".join(f"<td>{html.escape(_fmt(k, r.get(k)))}</td>" for _, k in cols)
        body.append(f'<tr class="{cls}">{tds}</tr>')
    tid = f' id="{table_id}"' if table_id else ""
    return (
        f"<div style='overflow-x:auto'><table{tid}><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def render(d: ReportData, out_dir: Path) -> Path:
    """Write report.html (+ PNGs) into out_dir atomically; return the HTML path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    s = d.sweep
    parts: list[str] = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Sweep {html.escape(s.name)}</title>"
        f"<style>{CSS}</style></head><body>",
        f"<h1>Sweep <code>{html.escape(s.name)}</code></h1>",
        f"<p class='sub'>stage {html.escape(s.stage)} · {d.gpus:,} GPUs · model {html.escape(s.model)} · hardware "
        f"{html.escape(s.hardware)} · workload {html.escape(s.workload)} · status {html.escape(s.status)} · "
        f"generated {datetime.now(UTC):%Y-%m-%d %H:%M UTC}</p>",
    ]
    if d.simulated:
        parts.append(
            "<p class='sim' id='simulated-banner'>SIMULATED: rows marked simulated come from the twin "
            "workload (the project's GPU-free stand-in). They rehearse the pipeline; they are not "
            "measurements of Megatron on GPUs.</p>"
        )
    ranked = [dict(r, rank=i + 1) for i, r in enumerate(d.measured)]
    parts.append(
        f"<h2>Measured candidates ({len(ranked)})</h2><p class='note'>Ranked on measured step p50 "
        "(tie-break p99, then memory). Δ vs best is relative to the fastest candidate that passed parity. "
        f"{html.escape(d.effective_note)}</p>"
    )
    best_id = next((r["candidate_id"] for r in ranked if r.get("parity") is not False), None)
    parts.append(
        _table(
            ranked,
            (*RANKED_HEAD, *knob_columns(ranked), *RANKED),
            table_id="ranked",
            cls_of=lambda r: "best" if r["candidate_id"] == best_id else "excluded" if r.get("parity") is False else "",
        )
    )
    if d.failed:
        parts.append(f"<h2>Failed attempts ({len(d.failed)})</h2>")
        parts.append(
            _table(
                [dict(r, layout=knobs.label(r)) for r in d.failed],
                (
                    ("candidate", "candidate_id"),
                    ("round", "round"),
                    ("layout", "layout"),
                    ("failure", "failure_class"),
                    ("pred memory (GB)", "pred_memory_gb"),
                    ("job", "job_id"),
                ),
                table_id="failed",
            )
        )
    for slug, title, fn in plots.FIGURES:
        png = fn(d)
        if png is None:
            parts.append(
                f"<figure id='fig-{slug}'><figcaption>{html.escape(title)}</figcaption>"
                "<p class='note'>Nothing to show for this sweep.</p></figure>"
            )
            continue
        (out_dir / f"{slug}.png").write_bytes(png)
        b64 = base64.b64encode(png).decode()
        parts.append(
            f"<figure id='fig-{slug}'><figcaption>{html.escape(title)}</figcaption>"
            f"<img alt='{html.escape(title)}' src='data:image/png;base64,{b64}'></figure>"
        )
    if d.calibrations:
        parts.append("<h2>Calibration per round</h2>")
        parts.append(
            _table(
                [
                    {
                        "round": c["round"],
                        "fit": json.dumps(c["fit"], sort_keys=True)[:300],
                        "error": json.dumps(c["error"], sort_keys=True)[:300],
                    }
                    for c in d.calibrations
                ],
                (("round", "round"), ("fit", "fit"), ("error", "error")),
                table_id="calibration",
            )
        )
    if d.lineage:
        parts.append("<h2>Promoted lineages</h2>")
        parts.append(
            _table(
                [dict(vars(l), efficiency=l.efficiency) for l in d.lineage],
                (
                    ("from sweep", "parent_sweep"),
                    ("GPUs", "parent_gpus"),
                    ("step (s)", "parent_step_s"),
                    ("to sweep", "child_sweep"),
                    ("GPUs", "child_gpus"),
                    ("step (s)", "child_step_s"),
                    ("m before", "parent_m"),
                    ("m after", "child_m"),
                    ("efficiency", "efficiency"),
                    ("layout", "label"),
                ),
                table_id="lineage",
            )
        )
    parts.append(path.fragment(d.search_path))
    parts.append(
        "<h2>Provenance</h2><pre id='provenance'>"
        + html.escape(json.dumps(d.provenance, indent=2, sort_keys=True, default=str))
        + "</pre>"
    )
    # Marks each figure with its decoded width once loaded, so a headless browser check can see broken images.
    parts.append(
        "<script>addEventListener('load',()=>document.querySelectorAll('img').forEach("
        "i=>i.setAttribute('data-natural-width',i.naturalWidth)))</script>"
    )
    parts.append("</body></html>")
    return atomic_write(out_dir / "report.html", "\n".join(parts))


REPORTS = Path("reports")


def out_folder(name: str, out: str | None = None) -> Path:
    """`reports/<name>/`, or `--out DIR`, which must lie inside `reports/` as well: the report never
    writes elsewhere (checked, symlinks resolved, before anything is opened or written)."""
    from orchestrator.sweep.setup import check_name

    root = REPORTS.resolve()
    folder = (Path(out) if out else REPORTS / check_name(name, source="the sweep name")).resolve()
    if folder != root and root not in folder.parents:
        raise UserError(f"--out {out} is outside {REPORTS}/: give a folder under it, e.g. --out {REPORTS}/{name}-v2")
    return folder


def report(ledger, name: str, folder: Path) -> Path:
    from orchestrator.report.data import gather

    return render(gather(ledger, name), folder)
