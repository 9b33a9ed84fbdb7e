"""The search's guide stays a guide, and its links land (issue 46 item 6).

docs/search.md says what a round does and what each knob does, under 300 lines; the measured changes are
docs/search-log.md's. Its knob table names every field of the policy and of the stage groups the search reads, each
with the schema's default (orchestrator/core/schema.py), so a default changed there fails here until the guide says
so. Every `page.md#anchor` link between the repository's pages points at a heading of that page (GitHub's anchors:
lower case, punctuation dropped, spaces as hyphens), so a section renamed or moved leaves no dead link.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from orchestrator.core.schema import BudgetConfig, PolicyConfig, ScreenConfig, StageConfig, WarmStartConfig

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "search.md"
MAX_LINES = 300
# The groups whose every field the guide's table lists, by dotted prefix; and the stage's own fields the search reads.
GROUPS = {
    "policy": PolicyConfig,
    "stage.screen": ScreenConfig,
    "stage.budget": BudgetConfig,
    "stage.warm_start": WarmStartConfig,
}
STAGE_FIELDS = ("probe_margin_gb", "memory_margin_gb")
ROW = re.compile(r"^\| `(?P<knob>[a-z0-9_.]+)` \| (?P<default>[^|]+?) \|", re.M)
# [text](page.md#anchor) or (#anchor); a reference definition `[label]: page.md#anchor`
LINK = re.compile(
    r"\]\((?P<page>[\w./-]*\.md)?#(?P<anchor>[^)\s]+)\)|^\[[^\]]+\]:\s*(?P<rpage>[\w./-]*\.md)?#(?P<ranchor>\S+)",
    re.M,
)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def table() -> dict[str, str]:
    return {m["knob"]: m["default"].strip() for m in ROW.finditer(GUIDE.read_text())}


def knobs() -> dict[str, object]:
    """Every knob the table must list, with the schema's default."""
    out: dict[str, object] = {}

    def walk(prefix: str, cls: type) -> None:  # nested groups (policy.schedule.fit_probes) field by field
        for f in dataclasses.fields(cls):
            value = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            if dataclasses.is_dataclass(value):
                walk(f"{prefix}.{f.name}", type(value))
            else:
                out[f"{prefix}.{f.name}"] = value

    for prefix, cls in GROUPS.items():
        walk(prefix, cls)
    stage = StageConfig()
    out.update({f"stage.{name}": getattr(stage, name) for name in STAGE_FIELDS})
    return out


def same(cell: str, value: object) -> bool:
    """The table's cell states the schema's scalar default (`true`, `6`, `0.05`, `calibrated_neighbours`)."""
    lit = cell.strip("`") if cell.startswith("`") and cell.endswith("`") else None
    if lit is None:
        return not isinstance(value, (bool, int, float, str))  # prose is for a list default only
    if isinstance(value, bool):
        return lit == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(lit) == float(value)
        except ValueError:
            return False
    return lit == str(value)


def test_the_guide_is_a_guide():
    lines = len(GUIDE.read_text().splitlines())
    assert lines < MAX_LINES, f"docs/search.md is {lines} lines: measured changes go to docs/search-log.md"


def test_the_knob_table_lists_every_knob_with_the_schemas_default():
    rows, want = table(), knobs()
    missing = sorted(set(want) - set(rows))
    unknown = sorted(set(rows) - set(want))
    both = sorted(set(rows) & set(want))
    wrong = [f"{k}: guide {rows[k]}, schema {want[k]!r}" for k in both if not same(rows[k], want[k])]
    assert not missing and not unknown and not wrong, f"missing {missing}; not a knob {unknown}; defaults {wrong}"


def test_the_table_check_sees_a_drifted_default():
    assert same("`0.05`", 0.05) and same("`true`", True) and same("`calibrated_neighbours`", "calibrated_neighbours")
    assert not same("`0.10`", 0.05) and not same("`false`", True) and not same("the table's", 3)


def test_every_link_to_a_section_lands_on_a_heading():
    pages = [ROOT / "README.md", ROOT / "DESIGN.md", *sorted((ROOT / "docs").glob("*.md"))]
    dead = []
    for page in pages:
        for m in LINK.finditer(page.read_text()):
            target, frag = (m["page"], m["anchor"]) if m["anchor"] else (m["rpage"], m["ranchor"])
            dest = (page.parent / target).resolve() if target else page
            if not dest.exists() or frag not in anchors(dest):
                dead.append(f"{page.relative_to(ROOT)}: {target or ''}#{frag}")
    assert not dead, "links to no heading:\n" + "\n".join(dead)
