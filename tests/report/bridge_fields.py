"""The dataclass fields of Megatron-Bridge's config classes, read with ast from the Bridge source and from
Megatron-LM at the project's tested commit (orchestrator/core/megatron.py TESTED_COMMIT: a `dev` commit after the
one Bridge's DeepSeek-V4 recipes were tested with, examples/models/deepseek_v4/README.md:9 `35f36c7c9dba`; the
submodule Bridge pins, 3rdparty/Megatron-LM, predates V4 and lacks e.g. `use_fused_mhc`, which the V4 recipes
set). Neither imports on a CPU without triton (megatron/core/transformer/moe/ops/paged_stash.py imports it), so
the fields are read, not imported.

`python -m tests.report.bridge_fields` rewrites tests/fixtures/bridge_fields.json from the mirrors; the tests
check the override against that record, and the record against the mirrors where they are on the machine.
"""

from __future__ import annotations

import ast
import json
import subprocess
from functools import cache
from pathlib import Path

from orchestrator.core.megatron import TESTED_COMMIT

BRIDGE_GIT = Path("/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
MEGATRON_GIT = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
RECORD = Path(__file__).resolve().parents[1] / "fixtures" / "bridge_fields.json"

# ConfigContainer's sections (src/megatron/bridge/training/config.py:962-1010) and, for `model`, the provider the
# DeepSeek-V4 bridge builds (models/deepseek/deepseek_v4_bridge.py:352 `provider=MLAModelProvider`).
SECTIONS = {
    "model": ("megatron.bridge.models.mla_provider", "MLAModelProvider"),
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "dataset": ("megatron.bridge.training.config", "GPTDatasetConfig"),
    "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
    "dist": ("megatron.bridge.training.config", "DistributedInitConfig"),
}


def available() -> bool:
    if not ((BRIDGE_GIT / "HEAD").is_file() and (MEGATRON_GIT / "HEAD").is_file()):
        return False
    probe = ["git", f"--git-dir={MEGATRON_GIT}", "cat-file", "-e", f"{TESTED_COMMIT}^{{commit}}"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={repo}", *args], capture_output=True, text=True, check=True).stdout


@cache
def commits() -> tuple[str, str]:
    """(Bridge HEAD, the Megatron-LM commit its Megatron Core classes are read at)."""
    return _git(BRIDGE_GIT, "rev-parse", "HEAD").strip(), TESTED_COMMIT


@cache
def _source(module: str) -> tuple[str, bool] | None:
    """(source, is a package) of a module of either repository; None: not theirs (typing, torch ...)."""
    bridge, pinned = commits()
    if module.startswith("megatron.bridge"):
        repo, commit, base = BRIDGE_GIT, bridge, "src/" + module.replace(".", "/")
    elif module.startswith(("megatron.core", "megatron.training")):
        repo, commit, base = MEGATRON_GIT, pinned, module.replace(".", "/")
    else:
        return None
    for path, package in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
        try:
            return _git(repo, "show", f"{commit}:{path}"), package
        except subprocess.CalledProcessError:
            continue
    return None


def _absolute(module: str, package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _where(module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """The module and ClassDef that `name` in `module` is (following imports and re-exports)."""
    found = _source(module)
    if found is None or depth > 8:
        return None
    src, package = found
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _where(_absolute(module, package, node), alias.name, depth + 1)
    return None


def fields(module: str, name: str) -> set[str]:
    """Every annotated field of the class and of its bases (the dataclass fields it accepts)."""
    hit = _where(module, name)
    if hit is None:
        raise LookupError(f"{module}.{name} not found")
    where, cls = hit
    out = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for base in cls.bases:
        base = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(base, ast.Name) and _where(where, base.id) is not None:
            out |= fields(where, base.id)
    return out


def resolve() -> dict:
    """The record: both commits and every section's fields, as the mirrors have them now."""
    bridge, pinned = commits()
    return {
        "source": "NVIDIA-NeMo/Megatron-Bridge HEAD; NVIDIA/Megatron-LM at the project's TESTED_COMMIT",
        "bridge_commit": bridge,
        "megatron_commit": pinned,
        "sections": {sec: sorted(fields(*where)) for sec, where in SECTIONS.items()},
    }


def recorded() -> dict:
    return json.loads(RECORD.read_text())


if __name__ == "__main__":
    RECORD.write_text(json.dumps(resolve(), indent=1) + "\n")
    print(f"wrote {RECORD}")
