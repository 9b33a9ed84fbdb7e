"""What a Megatron-LM checkout on a node is: its git commit, and which known fixes its code carries.

Why read files and not run git or import Megatron: the container may have no git, and importing megatron.core
without its kernels fails for unrelated reasons. The commit comes from the checkout's git metadata (HEAD, a
loose ref or packed-refs; a worktree's or submodule's `.git` file is followed); a fix is detected in the code
itself (the fixed behaviour), never from a version string, which dev does not bump. Stdlib only.

FIXES maps each legality rule a Megatron fix removes (orchestrator.plan.rules.LIFTABLE) to its detector here;
preflight lifts a rule only when its detector says the checkout carries the fix.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

from orchestrator.core.megatron import TESTED_COMMIT

RECOMPUTE = "megatron/core/recompute.py"
_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def _git_dir(root: Path) -> Path | None:
    dot = root / ".git"
    if dot.is_dir():
        return dot
    if dot.is_file():  # a worktree or submodule: "gitdir: <path>"
        text = dot.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            target = Path(text.split(":", 1)[1].strip())
            target = target if target.is_absolute() else (root / target)
            return target.resolve() if target.is_dir() else None
    return None


def _ref(git: Path, ref: str) -> str | None:
    common = git
    if (git / "commondir").is_file():  # a worktree's refs live in the main git dir
        common = (git / (git / "commondir").read_text().strip()).resolve()
    for base in dict.fromkeys((git, common)):
        loose = base / ref
        if loose.is_file():
            value = loose.read_text(errors="replace").strip()
            return value if _SHA.fullmatch(value) else None
        packed = base / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(errors="replace").splitlines():
                sha, _, name = line.partition(" ")
                if name.strip() == ref and _SHA.fullmatch(sha):
                    return sha
    return None


def git_commit(root: str | Path) -> str | None:
    """The commit the checkout at `root` has checked out, from its git metadata; None without any."""
    git = _git_dir(Path(root))
    if git is None or not (git / "HEAD").is_file():
        return None
    head = (git / "HEAD").read_text(errors="replace").strip()
    if head.startswith("ref:"):
        return _ref(git, head.split(":", 1)[1].strip())
    return head if _SHA.fullmatch(head) else None


def is_tested(commit: str | None) -> bool:
    return bool(commit) and commit == TESTED_COMMIT


# ------------------------------------------------------------------------------------------- known fixes
def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _drops(loop: ast.For) -> set[str]:
    """The string keys a `for k in ("a", "b"): kwargs.pop(k, ...)` loop removes."""
    pops = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "pop"
        for n in ast.walk(ast.Module(body=loop.body, type_ignores=[]))
    )
    if not pops or not isinstance(loop.iter, ast.Tuple | ast.List | ast.Set):
        return set()
    return {e.value for e in loop.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def recompute_keeps_input_ids(root: str | Path) -> bool | None:
    """Does the checkout's full recompute hand input_ids to a hybrid mHC layer (the fix of Megatron-LM PR #6704)?

    Dev d48bd6be0a85's checkpointed_forward (megatron/core/recompute.py:95-108) calls a TransformerLayer with
    every kwarg and pops context/.../input_ids for any other layer, HyperConnectionHybridLayer included, so a
    hash-routed MoE layer inside it asserts (megatron/core/transformer/moe/router.py:811-815). Fixed: the
    function recognises the wrapper (its `inner_layer`, or the class by name), or no longer pops input_ids for
    any layer. None when the file or function is missing (an unknown Megatron: the rule holds)."""
    path = Path(root) / RECOMPUTE
    if not path.is_file():
        return None
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return None
    fn = _function(tree, "checkpointed_forward")
    if fn is None:
        return None
    names = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
    names |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    names |= {n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if {"inner_layer", "HyperConnectionHybridLayer"} & names:
        return True
    return not any("input_ids" in _drops(loop) for loop in ast.walk(fn) if isinstance(loop, ast.For))


FULL_RECOMPUTE_FIX = "full recompute keeps input_ids for hybrid mHC layers (Megatron-LM PR #6704)"
# rule id (orchestrator.plan.rules) -> (what the fix does, its detector)
FIXES: dict[str, tuple[str, Callable[[str | Path], bool | None]]] = {
    "v4.full_recompute_hash_mhc": (FULL_RECOMPUTE_FIX, recompute_keeps_input_ids),
}


def fixes(root: str | Path) -> dict[str, bool | None]:
    """rule id -> whether the checkout carries the fix that lifts it (None: cannot tell, the rule holds)."""
    return {rule: detect(root) for rule, (_what, detect) in FIXES.items()}
