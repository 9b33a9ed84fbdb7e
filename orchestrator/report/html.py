"""Write the report page: one self-contained HTML file (figures embedded as PNG data URIs, and also
written beside it), every value escaped. It opens on the decision (orchestrator/report/decision.py):
the recommended layout, its margin over the runner-up, its evidence and its exact Megatron flags; then
the ranked table, sized for a 1400 px window (orchestrator/report/sections.py). Simulated results say
SIMULATED in the headline, the banner and the table."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.core import knobs
from orchestrator.core.errors import UserError
from orchestrator.core.paths import atomic_write
from orchestrator.report import path, plots, sections
from orchestrator.report.data import ReportData
from orchestrator.report.decision import Decision, decide
from orchestrator.report.fmt import fmt as _fmt  # noqa: F401 - the name other report modules import
from orchestrator.report.fmt import table as _table

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:16px 24px;color:#1f2933;max-width:1400px}
h1{margin:0 0 2px;font-size:24px} h2{font-size:18px;margin:18px 0 4px} .sub{color:#52606d;margin:0 0 8px}
.sim{background:#fff3c4;border:1px solid #f0b429;padding:6px 12px;border-radius:6px;font-weight:600;margin:6px 0}
table{border-collapse:collapse;font-size:12px;margin:6px 0 12px}
th,td{border:1px solid #d9e2ec;padding:2px 6px;text-align:right}
th{background:#f0f4f8;position:sticky;top:0} td.l,th.l{text-align:left} tr.best td{background:#e3f8ec;font-weight:600}
tr.excluded td{color:#9aa5b1;text-decoration:line-through}
#ranked td,#details td{white-space:nowrap}
figure{margin:12px 0 24px} figcaption{font-weight:600;margin-bottom:6px} img{max-width:100%}
.note{color:#52606d;font-size:12px;margin:2px 0} code{background:#f0f4f8;padding:1px 4px;border-radius:3px}
.decision{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:16px;border:2px solid #3ebd93;
 border-radius:8px;padding:10px 14px;margin:8px 0;background:#f7fdf9}
.decision.none{display:block;border-color:#d9e2ec;background:#f5f7fa}
.kicker{font-size:13px;text-transform:uppercase;letter-spacing:.04em;color:#52606d;font-weight:600}
.layout{font-size:22px;font-weight:700;font-family:ui-monospace,Menlo,Consolas,monospace;margin:2px 0 4px}
.badge{display:inline-block;padding:1px 8px;border-radius:4px;font-size:12px;margin-left:6px;letter-spacing:0}
.badge.sim{background:#f0b429;color:#1f2933} .badge.meas{background:#3ebd93;color:#fff}
.warn{color:#b44d12} #margin{margin:2px 0 6px;font-size:14px}
table.evidence{margin:4px 0;font-size:13px} table.evidence th{text-align:left;position:static;width:95px}
table.evidence td{text-align:left}
.flags-head{font-weight:600;font-size:13px;margin-bottom:4px} .flags-head button{margin-left:8px;font-size:12px}
#flags{max-height:230px;overflow:auto;background:#1f2933;color:#f5f7fa;padding:8px 10px;border-radius:6px;
 font-size:12px;margin:0;white-space:pre-wrap;word-break:break-all}
details{margin:0 0 12px} summary{cursor:pointer;font-size:13px;color:#334e68}
"""
# Copies the flags block (the Clipboard API, else a selection and execCommand for pages opened from file://),
# and marks the page once loaded, so a headless browser check can see what a reader sees: each figure's
# decoded width, the document's scroll width, every table that overflows its box, and which of the decision's
# parts (FIRST_SCREEN) are whole on the first screen.
FIRST_SCREEN = ("#recommended-layout", "#margin", "#evidence", "#flags", "#ranked tbody tr")
SCRIPT = (
    "<script>const FIRST="
    + json.dumps(list(FIRST_SCREEN))
    + """;
function copyFlags(){const t=document.getElementById('flags').textContent,b=document.getElementById('copy-flags');
 const done=()=>{b.textContent='Copied'};
 if(navigator.clipboard&&window.isSecureContext){navigator.clipboard.writeText(t).then(done);return}
 const r=document.createRange();r.selectNodeContents(document.getElementById('flags'));
 const s=getSelection();s.removeAllRanges();s.addRange(r);document.execCommand('copy');done()}
addEventListener('load',()=>{const e=document.documentElement;
 document.querySelectorAll('img').forEach(i=>i.setAttribute('data-natural-width',i.naturalWidth));
 e.setAttribute('data-scroll-width',e.scrollWidth);e.setAttribute('data-client-width',e.clientWidth);
 e.setAttribute('data-overflowing',[...document.querySelectorAll('.wrap')].filter(w=>w.scrollWidth>w.clientWidth)
  .map(w=>w.firstElementChild.id||'?').join(' '));
 e.setAttribute('data-first-screen',FIRST.filter(q=>{const x=document.querySelector(q);
  return x&&x.getBoundingClientRect().bottom<=innerHeight}).join('|'))})
</script>"""
)
EMPTY = {  # why a figure has nothing to draw, said instead of an empty plot
    "step-cdf": "No step-time samples were recorded for the measured candidates.",
    "pareto": "No eligible candidate has both throughput and peak memory measured.",
    "calibration": "No measured candidate carries a planning-time prediction to compare with.",
    "rounds": "No round has a measured result yet.",
    "scaling": "No promoted lineage: this sweep's candidates were not promoted from an earlier stage.",
    "expert-load": "No expert-load records: the workload reported no tokens per expert.",
}


def figure_notes(slug: str, d: ReportData) -> list[str]:
    """What a drawn figure leaves out because the series has no information (all zero or unmeasured)."""
    top = [r for r in d.measured[: plots.TOP] if r.get("expert_load_p50") is not None]
    if slug == "expert-load" and top:
        out = []
        if all(not r.get("token_drop_fraction") for r in top):
            out.append("Token drop: no drops measured (0 for every finalist shown).")
        if all(r.get("hot_expert_ratio") is None for r in top):
            out.append("Hot-expert ratio: not measured.")
        return out
    if slug == "calibration" and not any(r.get("pred_memory_gb") and sections.peak(r)[0] for r in d.measured):
        return ["Memory: no candidate has both a predicted and a measured peak."]
    return []


def _figures(d: ReportData, out_dir: Path) -> list[str]:
    parts = []
    for slug, title, fn in plots.FIGURES:
        png = fn(d)
        notes = [EMPTY.get(slug, "Nothing to show for this sweep.")] if png is None else figure_notes(slug, d)
        note = "".join(f"<p class='note empty'>{html.escape(n)}</p>" for n in notes)
        if png is None:
            parts.append(f"<figure id='fig-{slug}'><figcaption>{html.escape(title)}</figcaption>{note}</figure>")
            continue
        (out_dir / f"{slug}.png").write_bytes(png)
        b64 = base64.b64encode(png).decode()
        parts.append(
            f"<figure id='fig-{slug}'><figcaption>{html.escape(title)}</figcaption>{note}"
            f"<img alt='{html.escape(title)}' src='data:image/png;base64,{b64}'></figure>"
        )
    return parts


def _failed(d: ReportData) -> str:
    return f"<h2>Failed attempts ({len(d.failed)})</h2>" + _table(
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
        left=("layout", "failure_class"),
    )


def _lineage(d: ReportData) -> str:
    return "<h2>Promoted lineages</h2>" + _table(
        [dict(vars(l), efficiency=l.efficiency, candidate=plots.short_label(l)) for l in d.lineage],
        (
            ("candidate", "candidate"),  # the scaling figure's bar labels
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
        left=("label",),
    )


def render(d: ReportData, out_dir: Path, decision: Decision, extra: Sequence[str] = ()) -> Path:
    """Write report.html (+ PNGs) into out_dir atomically; return the HTML path.

    The page, top to bottom: the decision, the ranked table, failures, figures, then `extra` (HTML
    sections other ledger readers add, e.g. the search path), calibration, lineages and provenance."""
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
            "<p class='sim' id='simulated-banner'>SIMULATED: these results come from the twin workload (the "
            "project's GPU-free stand-in). They rehearse the pipeline; they are not measurements of Megatron "
            "on GPUs.</p>"
        )
    parts.append(sections.headline(d, decision))
    parts.append(sections.ranked(d, decision))
    if d.failed:
        parts.append(_failed(d))
    parts.extend(_figures(d, out_dir))
    parts.extend(extra)
    if d.calibrations:
        parts.append(sections.calibration(d))
    if d.lineage:
        parts.append(_lineage(d))
    parts.append(
        "<h2>Provenance</h2><pre id='provenance'>"
        + html.escape(json.dumps(d.provenance, indent=2, sort_keys=True, default=str))
        + "</pre>"
    )
    parts.append(SCRIPT)
    parts.append("</body></html>")
    return atomic_write(out_dir / "report.html", "\n".join(parts))


REPORTS = Path("reports")


def out_folder(name: str, out: str | None = None) -> Path:
    """`reports/<name>/`, or `--out DIR`, which must lie inside `reports/` as well: the report never
    writes elsewhere (checked, symlinks resolved, before anything is opened or written)."""
    from orchestrator.core.paths import check_name

    root = REPORTS.resolve()
    folder = (Path(out) if out else REPORTS / check_name(name, source="the sweep name")).resolve()
    if folder != root and root not in folder.parents:
        raise UserError(f"--out {out} is outside {REPORTS}/: give a folder under it, e.g. --out {REPORTS}/{name}-v2")
    return folder


def report(ledger, name: str, folder: Path) -> Path:
    """Gather the sweep, decide, and render. `extra` holds further sections (the search path), placed
    after the figures."""
    from orchestrator.report.data import gather

    d = gather(ledger, name)
    extra: list[str] = [path.fragment(d.search_path)]  # how the search got there (report/path.py)
    return render(d, folder, decide(ledger, d), extra)
