"""The search path: every candidate in the order the policy proposed it, with why (the ledger's
candidate.decision: move kind, fidelity, predicted gain and its uncertainty, parent) and what it measured.

Shown by `status` and the report, so a reader can check each round's reasoning against its outcome: which
moves found the best, which predicted gains did not materialize, what was pruned and later revived.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from orchestrator.core import ranking
from orchestrator.core.metrics import STEP_P50
from orchestrator.core.states import CandidateStatus, Fidelity

COLUMNS = (
    ("round", "round"),
    ("layout", "layout"),
    ("move", "move"),
    ("fidelity", "fidelity"),
    ("pred gain", "predicted_gain"),
    ("± sd", "uncertainty"),
    ("from", "parent"),
    ("outcome", "outcome"),
    ("screen p50 (s)", "screen_p50_s"),
    ("step p50 (s)", "step_p50_s"),
    ("best so far", "new_best"),
)


def gather(ledger, name: str) -> list[dict]:
    """One row per candidate of the sweep, in proposal order (round, then id): decision and outcome. A screened
    candidate shows its screen p50; one confirmed shows both; only a full-window p50 can be a new best."""
    from orchestrator import history

    cands = sorted(ledger.candidates(name), key=lambda c: (c.round, c.id))
    by_id = {c.id: c for c in cands}
    cut = history.cut_candidates(ledger, name)  # stopped by the early cut
    rows: list[dict] = []
    so_far: list[tuple[ranking.Standing, int]] = []  # the full-window results seen so far, by candidate
    for c in cands:
        why = c.decision
        # screened or probed, then run at the full window: the first move
        first = why.previous if why.previous is not None and why.previous.stored else why
        atts = ledger.attempts(c.id)
        a = atts[-1] if atts else None
        p50s: dict[str, float] = {}
        full: ranking.Standing | None = None
        for x in atts:
            res = ledger.evidence.result(x.id)
            if res and res.get(STEP_P50) is not None:
                p50s[x.fidelity] = res[STEP_P50]
                if x.fidelity == Fidelity.FULL:
                    bad = c.status == CandidateStatus.EXCLUDED or any(
                        not p.passed for p in ledger.evidence.parity(c.id)
                    )
                    full = ranking.standing(res, fidelity=x.fidelity, partial=res["partial"], excluded=bad, order=x.id)
        p50 = p50s.get(Fidelity.FULL)
        parent = by_id.get(c.parent_id) if c.parent_id is not None else None
        new_best = False
        if full is not None:  # a new best: the ranking's best of every full-window result so far is this one
            so_far.append((full, c.id))
            top = ranking.best(so_far, lambda sc: sc[0])
            new_best = top is not None and top[1] == c.id and full.eligible
        rows.append(
            {
                "round": c.round,
                "key": c.key,
                "layout": c.layout.short(),
                "kind": first.kind or (str(c.edge_kind) if c.edge_kind else "plan"),
                "move": first.move or (str(c.edge_kind) if c.edge_kind else "-"),
                "fidelity": f"{first.fidelity}->full" if first is not why else str(why.fidelity),
                "predicted_gain": why.predicted_gain,
                "uncertainty": why.uncertainty,
                "parent": parent.layout.short() if parent else (why.parent or "")[:10],
                "outcome": (
                    (a.failure_class or str(a.state))
                    if a is not None and not p50s
                    else ("cut early" if c.id in cut else str(c.status))
                ),
                "screen_p50_s": p50s.get(Fidelity.SCREEN),
                "step_p50_s": p50,
                "new_best": new_best,
                "revived": first.revived,  # pruned by the uncalibrated memory model, fit calibrated
            }
        )
    return rows


def _fmt(key: str, v) -> str:
    if v is None or v == "":
        return "-"
    if key in ("predicted_gain", "uncertainty"):
        return f"{float(v):+.1%}" if key == "predicted_gain" else f"{float(v):.1%}"
    if key in ("step_p50_s", "screen_p50_s"):
        return f"{float(v):.3f}"
    if key == "new_best":
        return "new best" if v else ""
    return str(v)


def lines(rows: Sequence[dict]) -> list[str]:
    """Plain-text search path for `status`: one line per proposal."""
    return [
        f"  r{r['round']} {r['move']:<26} {r['fidelity']:<7} gain {_fmt('predicted_gain', r['predicted_gain']):>7} "
        f"± {_fmt('uncertainty', r['uncertainty']):>6}  {r['outcome']:<10} {_fmt('step_p50_s', r['step_p50_s']):>9} "
        f"{r['layout']}"
        + (f"  (screen {_fmt('screen_p50_s', r['screen_p50_s'])})" if r.get("screen_p50_s") is not None else "")
        + ("  <- new best" if r["new_best"] else "")
        for r in rows
    ]


def fragment(rows: Sequence[dict]) -> str:
    """The report's 'Search path' section (an HTML fragment, table id 'search-path')."""
    if not rows:
        return "<h2>Search path</h2><p class='note'>No candidates yet.</p>"
    head = "".join(f"<th>{html.escape(t)}</th>" for t, _ in COLUMNS)
    body = "".join(
        f"<tr class='{'best' if r['new_best'] else ''}' data-kind='{html.escape(str(r['kind']))}'>"
        + "".join(f"<td>{html.escape(_fmt(k, r.get(k)))}</td>" for _, k in COLUMNS)
        + "</tr>"
        for r in rows
    )
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    summary = ", ".join(f"{n} {html.escape(k)}" for k, n in kinds.items())
    revived = sum(1 for r in rows if r.get("revived"))
    if revived:
        summary += f"; {revived} revived (pruned by the uncalibrated memory model, proposed once calibration fit them)"
    return (
        "<h2>Search path</h2><p class='note'>Every proposal in order, with why the policy chose it (move, "
        f"fidelity, predicted gain over the best measured and its uncertainty) and what it measured: {summary}.</p>"
        f"<table id='search-path'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )
