"""jobs/twin/ is a package whose only door to the planner's models is jobs/twin/truth.py."""

from __future__ import annotations

import ast
from pathlib import Path

TWIN = Path(__file__).resolve().parent.parent / "jobs" / "twin"
# The planner's models (step time, memory, FLOPs, the planner itself). Flag parsing (argv), the hybrid
# pattern (pipeline.count_blocks), Layout arithmetic and the rank order are not models.
MODELS = {f"orchestrator.plan.{m}" for m in ("planner", "memory", "steptime", "moe", "flops", "params")}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_only_truth_asks_the_planners_models():
    users = {p.name for p in TWIN.glob("*.py") if imported(p) & MODELS}
    assert users == {"truth.py"}
