"""Make the installed megatron-core 0.19.2 importable on this CPU / Python 3.11 machine, for tests.

The shims live in orchestrator/job/megatron_check.py (the training-ready check runs on machines without a GPU
too): a stand-in for the one module that imports triton, Python 3.12's typing.override, and GPU queries
answered as an H100 (sm_90) while validate_args runs (`as_hopper`).

`megatron_tree(ref)` exports Megatron-LM's own tree at a commit (dev, a PR) from a local mirror into a cached
folder, and `run_in_tree` runs a probe module against it in a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from orchestrator.job import megatron_check


def import_megatron() -> ModuleType:
    """Import megatron.core and megatron.training on CPU; return the `megatron` package."""
    return megatron_check.import_megatron()


@contextlib.contextmanager
def as_hopper() -> Iterator[None]:
    """While active, Megatron's GPU queries answer as an H100 (sm_90) with CUDA_DEVICE_MAX_CONNECTIONS=1."""
    with megatron_check.as_arch(megatron_check.HOPPER_ARCH):
        yield


def megatron_available() -> bool:
    try:
        import_megatron()
    except Exception:  # noqa: BLE001 - any import failure means "not installed here"
        return False
    return True


# ------------------------------------------------------------------------------------------ Megatron trees
# Megatron-LM's own code at a named commit, for CPU tests that must run *that* code (dev's checkpointed_forward,
# a PR's parser): exported from a local git mirror of github.com/NVIDIA/Megatron-LM (the `fetch` of it, or any
# clone: MEGATRON_LM_GIT names its git dir) into a cached folder, never copied into this repository.
MIRROR = os.environ.get("MEGATRON_LM_GIT", "/work/.mirror/NVIDIA+Megatron-LM/repo")
TREES = Path(os.environ.get("MEGATRON_LM_TREES", Path(tempfile.gettempdir()) / "orch-megatron-trees"))
DEV = "dev"  # d48bd6be0a85 (orchestrator.core.megatron.TESTED_COMMIT)
PR_6704 = "refs/pull/6704/head"  # "Fix full recompute for hybrid mHC and MTP layers" (unmerged)
PR_6704_FIX = "674c0d00f9b3cf150b4f51a4dce8ded9be8678cb"  # that PR's fix commit (the head's later commit breaks import)
PR_6756 = "refs/pull/6756/head"  # "merge main into dev" (open)


def _git(*args: str) -> str:
    out = subprocess.run(["git", "--git-dir", MIRROR, *args], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {out.stderr.strip()[:300]}")
    return out.stdout.strip()


def mirror_has(ref: str) -> bool:
    try:
        _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        return False
    return True


ENTRY = ("megatron", "pretrain_hybrid.py")  # the package and the entry script preflight looks for


def megatron_tree(ref: str, *, apply: tuple[str, ...] = (), paths: tuple[str, ...] = ENTRY) -> Path:
    """A folder holding Megatron-LM's `paths` at `ref`, with each commit of `apply` applied on top (its diff to
    its parent), exported once and cached by commit; a test is skipped when the mirror lacks `ref`.

    The folder is written under a temporary name and renamed into place, so concurrent test runs share it safely."""
    import pytest

    for r in (ref, *apply):
        if not mirror_has(r):
            pytest.skip(f"no Megatron-LM mirror with {r} at {MIRROR} (set MEGATRON_LM_GIT to a clone's git dir)")
    commit = _git("rev-parse", f"{ref}^{{commit}}")
    name = commit[:12] + "".join(f"+{_git('rev-parse', c)[:12]}" for c in apply)
    if paths != ENTRY:
        name += "-" + "-".join(p.replace("/", "_") for p in paths)
    final = TREES / name
    if (final / ".complete").is_file():
        return final
    TREES.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=TREES))
    archive = subprocess.run(["git", "--git-dir", MIRROR, "archive", commit, *paths], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
    for c in apply:
        diff = subprocess.run(
            ["git", "--git-dir", MIRROR, "diff", f"{c}~1", c, "--", *paths], capture_output=True, check=True
        ).stdout
        subprocess.run(["git", "apply", "-"], input=diff, cwd=work, check=True, capture_output=True)
    (work / ".commit").write_text(commit + "".join(f" +{c}" for c in apply) + "\n")
    (work / ".complete").write_text("")
    try:
        work.rename(final)
    except OSError:  # another run got there first
        shutil.rmtree(work, ignore_errors=True)
    return final


def run_in_tree(tree: Path, module: str, *args: str, timeout: int = 600) -> dict:
    """`python -m <module> <tree> args...` in a fresh interpreter (one process imports one Megatron), with this
    project importable; the module prints one JSON object as its last stdout line."""
    import json
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.run(
        [sys.executable, "-m", module, str(tree), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=root,
        env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{module} in {tree} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(lines[-1])
