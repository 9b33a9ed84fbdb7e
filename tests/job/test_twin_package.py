"""orchestrator/job/twin/ is a package that never asks the planner's performance models: its time and memory come from
its own truth (orchestrator/job/twin/truth/, which imports nothing of orchestrator/plan: tests/job/test_truth.py), and
legality from Megatron's rules as orchestrator/plan/rules.py records them (orchestrator/job/twin/legal.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TWIN = Path(__file__).resolve().parents[2] / "orchestrator" / "job" / "twin"
# The planner's performance models (step time, memory, FLOPs, MoE traffic, the planner itself). Flag parsing
# (argv), the hybrid pattern (pipeline), Layout arithmetic, the rank order, the rule table and the layer
# count it needs (params.effective_layers) are not.
MODELS = {f"orchestrator.plan.{m}" for m in ("planner", "memory", "steptime", "moe", "flops")}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_twin_module_asks_the_planners_models():
    paths = list(TWIN.rglob("*.py"))
    assert len(paths) > 8, "the walk found the twin package"
    users = {str(p.relative_to(TWIN)) for p in paths if imported(p) & MODELS}
    assert users == set(), users
