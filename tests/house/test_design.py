"""DESIGN.md's import graph is the real one: every room's imports, read from the source with ast.

A room is a package folder (orchestrator/plan, orchestrator/job/twin, orchestrator/ledger, ...) or a
top-level module of orchestrator/ (orchestrator/config, orchestrator/cli, ...). Imports inside functions
count: a lazy import is still an edge a reader must know about. When this fails, the message prints the
block to paste into DESIGN.md."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator",)
BLOCK = re.compile(r"<!-- import-graph -->\n```text\n(.*?)```", re.S)


def room(module: str) -> str | None:
    """The room a dotted module name lives in (None: not this project's): its deepest package folder below
    the top level (orchestrator/plan, orchestrator/job/twin/truth), else the module itself for orchestrator's top-level
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
        # `from orchestrator import knobs` imports the module orchestrator.core.knobs, not the package.
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


def test_the_layers_import_only_what_lies_below():
    """core/ is stdlib only; plan/ is pure (core alone); the twin's truth is not the planner; the ledger knows
    the vocabularies and nothing of the orchestration above it."""
    edges = actual_graph()
    assert edges["orchestrator/core"] == set()
    assert edges["orchestrator/plan"] <= {"orchestrator/core"}
    assert edges["orchestrator/job/twin/truth"] <= {"orchestrator/core"}  # config dataclasses only, never the models
    assert edges["orchestrator/ledger"] <= {"orchestrator/core"}


def test_the_search_never_reads_the_ledger():
    """The sweep turns ledger rows into observations; a searcher sees only those."""
    assert "orchestrator/ledger" not in actual_graph()["orchestrator/search"]


def test_a_searcher_never_schedules_and_the_driver_never_builds_a_task_itself():
    """The schedule (fidelity rungs) stands on the searchers, never the other way round; the driver reaches the
    compute node's code only through runspec's one spec -> task assembly."""
    edges = actual_graph()
    assert "orchestrator/search" in edges["orchestrator/schedule"]
    assert "orchestrator/schedule" not in edges["orchestrator/search"]
    assert "orchestrator/job" not in edges["orchestrator/sweep"] | edges["orchestrator/commands"]


def test_the_room_graph_has_no_cycle():
    """No two rooms import each other, directly or around a loop: every arrow runs down a floor."""
    edges = actual_graph()
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            assert seen.get(nxt) != 1, "import cycle: " + " -> ".join([*path, node, nxt])
            if nxt not in seen:
                visit(nxt, [*path, node])
        seen[node] = 2

    for node in sorted(edges):
        if node not in seen:
            visit(node, [])


def test_a_backend_is_reached_only_through_the_registry():
    """A launcher backend is a plug-in (orchestrator/launch/registry.py): no room imports a backend's folder, not
    config, preflight or the sweep, not even launch/auto, which loads the folders it finds; each asks the registry."""
    launch = ROOT / "orchestrator" / "launch"
    backends = {f"orchestrator/launch/{p.name}" for p in launch.iterdir() if (p / "__init__.py").is_file()}
    backends -= {"orchestrator/launch/auto"}
    assert {"orchestrator/launch/slurm", "orchestrator/launch/local"} <= backends
    edges = actual_graph()
    reach = {src: sorted(dsts & backends) for src, dsts in edges.items() if dsts & backends}
    assert reach == {}, f"rooms that import a backend instead of asking orchestrator/launch/auto: {reach}"
    for room_ in ("orchestrator/config", "orchestrator/preflight", "orchestrator/sweep"):
        assert "orchestrator/launch/auto" in edges[room_]
