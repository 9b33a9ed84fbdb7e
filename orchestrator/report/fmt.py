"""How the report prints values and tables: every value escaped, numbers to a few significant digits."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from orchestrator.core.metrics import FRACTIONS

LEFT = ' class="l"'
PCT = {"pred_bubble", "delta_vs_best", *FRACTIONS}  # fractions print as percentages (the registry's unit)


def fmt(key: str, v) -> str:
    """One table cell's text: percentages for fractions, thousands separators, 3 significant digits."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key in PCT and isinstance(v, (int, float)):
        return f"{100 * v:+.1f}%" if key == "delta_vs_best" else f"{100 * v:.1f}%"
    if isinstance(v, float) and key.endswith("_gb"):
        return f"{v:.1f}"  # decimal GB: a tenth is the precision memory is compared at
    if isinstance(v, float):
        a = abs(v)
        return f"{v:,.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.3f}" if a >= 0.01 else f"{v:.3g}"
    return str(v)


def sig(v: float | None, digits: int = 3) -> str:
    """A float to `digits` significant digits ('1.41', '0.927'), '–' for None."""
    return "–" if v is None else f"{v:.{digits}g}"


def pct(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{100 * v:.{digits}f}%"


def esc(v) -> str:
    return html.escape(str(v))


def table(
    rows: Sequence[dict],
    cols: Sequence[tuple[str, str]],
    cls_of: Callable[[dict], str] | None = None,
    table_id: str = "",
    left: Sequence[str] = (),
    title: Callable[[dict], str] | None = None,
) -> str:
    """An HTML table in a `.wrap` div (which the page's load script checks for overflow). `cols` is
    (heading, row key); `left` names keys whose cells align left (text); `title` gives a row's tooltip."""
    lefts = set(left)
    head = "".join(
        f'<th class="l">{esc(h)}</th>' if i == 0 or k in lefts else f"<th>{esc(h)}</th>"
        for i, (h, k) in enumerate(cols)
    )
    body = []
    for r in rows:
        cls = cls_of(r) if cls_of else ""
        tip = f' title="{esc(title(r))}"' if title else ""
        tds = "".join(
            f"<td{LEFT if i == 0 or k in lefts else ''}>{esc(fmt(k, r.get(k)))}</td>" for i, (_, k) in enumerate(cols)
        )
        body.append(f'<tr class="{cls}"{tip}>{tds}</tr>')
    tid = f' id="{table_id}"' if table_id else ""
    return f"<div class='wrap'><table{tid}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
