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

import pytest

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


@pytest.mark.long
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


@pytest.mark.long
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


@pytest.mark.long
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


@pytest.mark.long
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


def module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (lazy imports included), one level below the rooms."""
    mods = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "migrations" not in p.parts
    }
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _targets(node):
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target not in (name, *PACKAGES):
                    edges[name].add(target)
    return edges


# Module cycles inside one room still open (issue 46 item 4 names the first); the set only shrinks.
KNOWN_MODULE_CYCLES = {
    ("orchestrator.search.calibrate", "orchestrator.search.memfit", "orchestrator.search.types"),
    ("orchestrator.ledger.evidence", "orchestrator.ledger.ledger", "orchestrator.ledger.queries"),
}


def module_cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: set[tuple[str, ...]] = set()

    def visit(n: str) -> None:
        index[n] = low[n] = len(index)
        stack.append(n)
        for w in sorted(edges.get(n, ())):
            if w not in index:
                visit(w)
                low[n] = min(low[n], low[w])
            elif w in stack:
                low[n] = min(low[n], index[w])
        if low[n] == index[n]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == n:
                    break
            if len(group) > 1:
                out.add(tuple(sorted(group)))

    for n in sorted(edges):
        if n not in index:
            visit(n)
    return out


@pytest.mark.long
def test_no_new_module_cycle():
    """Inside a room too, modules import one way: the driver's test fault hook lives in sweep/faults.py, so
    sweep/decide.py no longer imports sweep/loop.py (which imports decide)."""
    assert module_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == {("a", "b")}
    found = module_cycles(module_graph())
    assert found <= KNOWN_MODULE_CYCLES, f"new import cycle(s): {sorted(found - KNOWN_MODULE_CYCLES)}"
    assert not any(m.startswith("orchestrator.sweep.") for c in found for m in c)


HISTORY_MAY_IMPORT = {
    "orchestrator/core",
    "orchestrator/ledger",
    "orchestrator/plan",
    "orchestrator/search",
    "orchestrator/evidence",
}
# Ledger methods that write: the history floor calls none of them (the driver does).
WRITES = re.compile(r"^(log_event|set_|add_|record|requeue|redecide|claim|new_attempt|bind_launcher|launched|release)")


@pytest.mark.long
def test_the_past_is_a_read_only_floor_under_the_driver():
    """orchestrator/history reads the ledger, core and the search's types, never the driver, the schedule or a
    launcher, and writes nothing; the driver, `status` and the report read the past from it, and the report
    imports nothing of the driver or the schedule (issue 46 item 2)."""
    edges = actual_graph()
    assert edges["orchestrator/history"] <= HISTORY_MAY_IMPORT, edges["orchestrator/history"] - HISTORY_MAY_IMPORT
    assert not edges["orchestrator/report"] & {"orchestrator/sweep", "orchestrator/schedule"}
    for reader in ("orchestrator/sweep", "orchestrator/report", "orchestrator/commands"):
        assert "orchestrator/history" in edges[reader], reader
    writes = [
        f"{p.name}:{node.lineno}: {node.func.attr}"
        for p in (ROOT / "orchestrator" / "history").rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and WRITES.match(node.func.attr)
    ]
    assert not writes, f"orchestrator/history writes: {writes}"
