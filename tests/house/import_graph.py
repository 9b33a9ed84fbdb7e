"""The import graph's numbers, for a closing note: `python tests/house/import_graph.py` from the repository root
prints modules, rooms, floors, room edges, edges pointing up a floor, room cycles and module cycles, read with
tests/house/test_design.py's own graph code. FLOOR is DESIGN.md's floor table, room by room."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.house.test_design import ROOT, actual_graph, module_cycles, module_graph  # noqa: E402

FLOOR = {
    "orchestrator/core": 1,
    "orchestrator/plan": 2,
    "orchestrator/ledger": 2,
    "orchestrator/job": 3,
    "orchestrator/job/twin": 3,
    "orchestrator/job/twin/truth": 3,
    "orchestrator/evidence": 3,
    "orchestrator/launch": 3,
    "orchestrator/launch/auto": 3,
    "orchestrator/launch/slurm": 3,
    "orchestrator/launch/local": 3,
    "orchestrator/search": 4,
    "orchestrator/runspec": 4,
    "orchestrator/config": 4,
    "orchestrator/schedule": 5,
    "orchestrator/preflight": 5,
    "orchestrator/history": 5,
    "orchestrator/sweep": 6,
    "orchestrator/report": 7,
    "orchestrator/cli": 8,
    "orchestrator/__main__": 8,
    "orchestrator/commands": 8,
}


def main() -> None:
    edges = actual_graph()
    rooms = set(edges) | {d for ds in edges.values() for d in ds}
    up = sorted((s, d) for s, ds in edges.items() for d in ds if FLOOR[d] > FLOOR[s])
    mods = module_graph()
    print(
        f"modules {sum(1 for p in (ROOT / 'orchestrator').rglob('*.py') if 'migrations' not in p.parts)}, "
        f"rooms {len(rooms)}, "
        f"floors {len({FLOOR[r] for r in rooms})}, room edges {sum(map(len, edges.values()))}, edges up {len(up)}, "
        f"room cycles {len(module_cycles(edges))}, module cycles {sorted(module_cycles(mods))}"
    )


if __name__ == "__main__":
    main()
