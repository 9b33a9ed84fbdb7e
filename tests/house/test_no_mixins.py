"""No class is held under a size by splitting it into mixins (issue 17): a class of this package derives from at
most one class of this package that has methods, and the Ledger from none (its leases and evidence are parts it
holds). A base without methods is data, not a second job: the ORM's column sets built from a registry
(ledger/models `KnobColumns`, `ResultColumns`, SQLAlchemy's declarative mixins) stay allowed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def project_bases(root: Path) -> dict[str, list[str]]:
    """`module:Class` -> the names of its bases that are classes with methods defined somewhere in this package."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py")) if "migrations" not in p.parts}
    ours = {
        n.name
        for t in trees.values()
        for n in ast.walk(t)
        if isinstance(n, ast.ClassDef) and any(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for f in n.body)
    }
    found = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                found[f"{path.relative_to(root.parent)}:{node.name}"] = [n for n in names if n in ours]
    return found


def test_the_check_sees_a_mixin(tmp_path):
    pkg = tmp_path / "orchestrator"
    pkg.mkdir()
    code = "class Leases:\n    def lease(self): ...\nclass Evidence:\n    def result(self): ...\nclass Columns: ...\n"
    (pkg / "a.py").write_text(code + "class Ledger(Leases, Evidence): ...\nclass Row(Columns, Leases): ...\n")
    found = project_bases(pkg)
    assert found["orchestrator/a.py:Ledger"] == ["Leases", "Evidence"] and found["orchestrator/a.py:Row"] == ["Leases"]


@pytest.mark.long
def test_no_class_is_split_into_mixins():
    bases = project_bases(ROOT / "orchestrator")
    mixed = {name: b for name, b in bases.items() if len(b) > 1}
    assert not mixed, f"classes built from several of this package's classes (make them parts they hold): {mixed}"
    assert bases["orchestrator/ledger/ledger.py:Ledger"] == [], "the Ledger holds its leases and evidence as parts"
