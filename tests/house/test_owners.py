"""One owner per rule, checked over the whole package: the measured best is ranked only by
orchestrator/core/ranking.py and a launch's GPU-hours are computed only by orchestrator/core/cost.py.

A "best" sort over measurements is a sorted() / .sort() / min() / max() (a clamp such as max(0.0, step), with
a number among its arguments, is none) whose text, or its key function's, names a step-time figure (p50, p99,
a measured step); a
GPU-hour formula is arithmetic with 3600 (or cost's SECONDS_PER_HOUR). Each is read with `ast`, so a comment or
a docstring that names them is no hit.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
RANKING = PACKAGE / "core" / "ranking.py"
COST = PACKAGE / "core" / "cost.py"
# Still holding a copy, in files another branch of issue 17 owns (finalists as attempts, the schedule): that
# branch moves them onto core.ranking / core.cost. Remove an entry when its file no longer needs it.
PENDING: dict[str, tuple[str, ...]] = {}
# Orders predictions, not measurements: (file, key function) -> why.
PREDICTED = {("orchestrator/search/policies.py", "est"): "unmeasured neighbours by their optimistic predicted step"}
# Not a launch's cost: a rate per GPU-hour turned into one per wall second of N GPUs.
NOT_A_COST = {"orchestrator/evidence/effective.py"}
STEP_FIGURE = re.compile(r"p50|p99|step_s\b|measured_step|STEP_P", re.I)
SORTS = {"sorted", "min", "max"}


def _files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py") if "versions" not in p.parts)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _pending(path: Path, rule: str) -> bool:
    return rule in PENDING.get(_rel(path), ())


def _is_sort(node: ast.Call) -> bool:
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr == "sort"
    if not isinstance(f, ast.Name) or f.id not in SORTS:
        return False
    return f.id == "sorted" or not any(isinstance(a, ast.Constant) for a in node.args)


def _text(src: str, tree: ast.AST, node: ast.Call) -> str:
    """The call's text, with the body of a key function it names (key=rank, `def rank` in the same file)."""
    text = ast.get_source_segment(src, node) or ""
    for k in node.keywords:
        if k.arg == "key" and isinstance(k.value, ast.Name):
            defs = [d for d in ast.walk(tree) if isinstance(d, ast.FunctionDef) and d.name == k.value.id]
            text += "".join(ast.get_source_segment(src, d) or "" for d in defs)
    return text


def best_sorts(path: Path) -> list[str]:
    """Sorts and min/max over step-time figures in one file."""
    src = path.read_text()
    tree = ast.parse(src)
    out = []
    for node in ast.walk(tree):
        keys = {k.value.id for k in getattr(node, "keywords", ()) if k.arg == "key" and isinstance(k.value, ast.Name)}
        if isinstance(node, ast.Call) and _is_sort(node) and not any((_rel(path), k) in PREDICTED for k in keys):
            text = _text(src, tree, node)
            if STEP_FIGURE.search(text):
                out.append(f"{_rel(path)}:{node.lineno}: {text[:100]}")
    return out


def _hour(x: ast.expr) -> bool:
    return (isinstance(x, ast.Constant) and x.value in (3600, 3600.0)) or (
        isinstance(x, (ast.Name, ast.Attribute)) and "SECONDS_PER_HOUR" in ast.unparse(x)
    )


def hour_formulas(path: Path) -> list[str]:
    """Arithmetic with 3600 (seconds per hour) in one file."""
    src = path.read_text()
    out = []
    for node in ast.walk(ast.parse(src)):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.Div, ast.Mult))
            and (_hour(node.left) or _hour(node.right))
        ):
            out.append(f"{_rel(path)}:{node.lineno}: {ast.get_source_segment(src, node)}")
    return out


def test_the_checks_find_what_they_look_for(tmp_path):
    """Each check finds a copy of its rule (so an empty answer elsewhere means something), and no clamp."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "a = sorted(rows, key=lambda r: r.metrics['step_p50_s'])\n"
        "b = min(rows, key=lambda r: (r.step_s, r.p99_s))\n"
        "c = max(0.0, step_s)\n"
        "d = n_gpus * (startup + step * iters) / 3600.0\n"
        "def rank(r):\n    return r.metrics['step_p50_s']\n"
        "e = min(rows, key=rank)\n"
        "f = min(best, p50)\n"
    )
    assert [h.split(":")[1] for h in best_sorts(probe)] == ["1", "2", "7", "8"]
    assert [h.split(":")[1] for h in hour_formulas(probe)] == ["4"]
    assert hour_formulas(COST)  # the owner itself has the formula


@pytest.mark.long
def test_no_other_best_sort_over_measurements():
    found = [hit for p in _files(PACKAGE) if p != RANKING and not _pending(p, "ranking") for hit in best_sorts(p)]
    assert not found, "rank with orchestrator.core.ranking (ranked / best / ordered) instead:\n" + "\n".join(found)


@pytest.mark.long
def test_no_other_gpu_hour_formula():
    roots = (PACKAGE, ROOT / "tests" / "bench")
    found = [
        hit
        for p in _files(*roots)
        if p != COST and not _pending(p, "cost") and _rel(p) not in NOT_A_COST
        for hit in hour_formulas(p)
    ]
    assert not found, "charge with orchestrator.core.cost (launch_gpu_hours / attempt_gpu_hours):\n" + "\n".join(found)


def test_pending_entries_still_need_their_exemption():
    """An exemption a file no longer needs is removed (the list shrinks to nothing)."""
    check = {"ranking": best_sorts, "cost": hour_formulas}
    stale = [f"{name}: {rule}" for name, rules in PENDING.items() for rule in rules if not check[rule](ROOT / name)]
    assert not stale, stale


EVENT_CALLS = {"log_event": 1, "events": None, "Event": None}  # call name -> the positional index of its kind


def event_literals(path: Path) -> list[str]:
    """Ledger event kinds written as string literals in one file (a log_event, events or m.Event call whose kind
    is a str constant): every kind is a member of orchestrator/core/states.py EventKind."""
    src = path.read_text()
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name not in EVENT_CALLS:
            continue
        pos = EVENT_CALLS[name]
        kinds = [k.value for k in node.keywords if k.arg == "kind"]
        if pos is not None and len(node.args) > pos:
            kinds.append(node.args[pos])
        if any(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in kinds):
            out.append(f"{_rel(path)}:{node.lineno}: {(ast.get_source_segment(src, node) or '')[:100]}")
    return out


@pytest.mark.long
def test_every_event_kind_is_an_event_kind_member(tmp_path):
    """One owner for the words of the event table: no module types a kind as a string (tests may log their own)."""
    probe = tmp_path / "probe.py"
    probe.write_text('ledger.log_event(s, "stop", why)\nledger.events(s, kind="lease")\nm.Event(kind=EventKind.CUT)\n')
    assert [h.split(":")[1] for h in event_literals(probe)] == ["1", "2"]
    found = [hit for p in _files(PACKAGE) for hit in event_literals(p)]
    assert not found, "name the kind with orchestrator.core.states.EventKind:\n" + "\n".join(found)
