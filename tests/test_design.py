"""DESIGN.md's import graph is the real one: every room's imports, read from the source with ast.

A room is a package folder (orchestrator/plan, jobs/twin, db, ...) or a top-level module of orchestrator/
(orchestrator/knobs, orchestrator/schema, ...). Imports inside functions count: a lazy import is still an
edge a reader must know about. When this fails, the message prints the block to paste into DESIGN.md."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "jobs", "db")
BLOCK = re.compile(r"<!-- import-graph -->\n```text\n(.*?)```", re.S)


def room(module: str) -> str | None:
    """The room a dotted module name lives in (None: not this project's): its deepest package folder below
    the top level (orchestrator/plan, jobs/twin/truth), else the module itself for orchestrator's top-level
    modules (orchestrator/knobs), else the top package (jobs, db)."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    folders = [k for k in range(2, len(parts) + 1) if (ROOT.joinpath(*parts[:k])).is_dir()]
    if folders:
        return "/".join(parts[: folders[-1]])
    if parts[0] == "orchestrator" and len(parts) > 1:
        return f"orchestrator/{parts[1]}"
    return parts[0]


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        # `from orchestrator import knobs` imports the module orchestrator.knobs, not the package.
        subs = [f"{node.module}.{a.name}" for a in node.names]
        resolved = [s for s in subs if (ROOT / s.replace(".", "/")).with_suffix(".py").exists()]
        resolved += [s for s in subs if (ROOT / s.replace(".", "/")).is_dir()]
        return resolved or [node.module]
    return []


def actual_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "migrations" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            src = room(name)
            assert src is not None
            for node in ast.walk(ast.parse(path.read_text())):
                for target in _targets(node):
                    dst = room(target)
                    if dst is not None and dst != src and dst != "orchestrator":
                        edges[src].add(dst)
    return edges


def render(edges: dict[str, set[str]]) -> str:
    return "".join(f"{src} -> {' '.join(sorted(dsts))}\n" for src, dsts in sorted(edges.items()))


def test_design_md_draws_the_real_import_graph():
    match = BLOCK.search((ROOT / "DESIGN.md").read_text())
    assert match, "DESIGN.md lost its <!-- import-graph --> block"
    real = render(actual_graph())
    assert match.group(1) == real, f"DESIGN.md's import graph is stale; paste this block:\n{real}"


def test_the_planner_and_the_twins_truth_import_no_orchestration():
    """plan/ is pure; the twin's truth is not the planner (issue: a twin that is not the planner)."""
    edges = actual_graph()
    assert edges["orchestrator/plan"] <= {"orchestrator/knobs", "orchestrator/schema"}
    assert edges["jobs/twin/truth"] <= {"orchestrator/schema"}  # config dataclasses only, never the models
    assert edges["db"] <= {"orchestrator/knobs", "orchestrator/states"}


def test_policy_never_reads_the_ledger():
    """The sweep loop turns ledger rows into observations; a policy sees only those."""
    assert "db" not in actual_graph()["orchestrator/policy"]
