"""What tests/gpu/device.sh needs in `.devcarry/` (git-ignored), how it is packed into calls, and how the
device unpacks it: one module, so the staging machine and the device agree on every name and checksum.

Why calls: a lent GPU machine has no network, takes at most 64 MiB per call (the working tree included)
and keeps its disk only while warm (30 s between calls). Tier A fits one call. Tier B (a real V4 step) needs
Transformer Engine, whose CUDA 13 core wheel alone is 264 MiB: it travels split into pieces of at most
60 MiB, with a sha256 for every piece and for the reassembled wheel, over consecutive calls.

    python tests/gpu/devcarry.py expect tier-a|tier-b [--call K]      # fail fast: name what is missing
    python tests/gpu/devcarry.py stage tier-b --from DIR              # on a machine with the downloads
    python tests/gpu/devcarry.py receive K --store S                  # on the device, call K of tier B
    python tests/gpu/devcarry.py assemble --store S                   # on the device, after the last call

Layout of `.devcarry/` (DEVCARRY overrides the folder):
    whl/*.whl                 the orchestrator's own dependencies for the device's cp312 x86-64 (TIER_A_WHEELS)
    megatron-dev.tar.gz       `git archive` of Megatron-LM dev (TIER_A_MEGATRON) and megatron-dev.commit
    tier-b/manifest.json      written by `stage`: per call, its files with sizes and sha256
    tier-b/call-<K>/          what call K carries (carry [".devcarry/tier-b/call-K"]), manifest.json included
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
CALL_LIMIT = 64 * MIB  # what one call may carry, the working tree included (the device's limit)
PIECE_MAX = 60 * MIB  # the largest piece of the split wheel
SAFETY = 1 * MIB  # below the limit: file-system overheads, a file added to the tree meanwhile

# Tier A: the orchestrator's dependencies the device image lacks (name prefixes of the wheels), and Megatron.
TIER_A_WHEELS = (
    "hydra_core",
    "omegaconf",
    "antlr4_python3_runtime",
    "submitit",
    "sqlalchemy",
    "greenlet",
    "alembic",
    "mako",
    "typing_extensions",
)
TIER_A_MEGATRON = ("megatron-dev.tar.gz", "megatron-dev.commit")
MEGATRON_FILES = (  # what the tarball holds: `git archive ... dev <these>`
    "megatron",
    "pretrain_hybrid.py",
    "pretrain_gpt.py",
    "hybrid_builders.py",
    "model_provider.py",
    "gpt_builders.py",
    "mamba_builders.py",
)
# Tier B: Transformer Engine 2.20.2 for CUDA 13 / cp312 and what it imports that the image lacks.
TE_VERSION = "2.20.2"
TE_CORE = "transformer_engine_cu13"  # the 264 MiB wheel: split
TE_PURE = "transformer_engine-"  # the pure-Python wheel (1.25 MB)
TE_TORCH_SDIST = "transformer_engine_torch"  # source only: compiled on the device against its torch
TE_DEPS = (
    "nvidia_cudnn_frontend",
    "pydantic-",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "importlib_metadata",
    "nvdlfw_inspect",
)
STAGE_HELP = "run `python tests/gpu/devcarry.py stage tier-b --from DIR` (docs/gpu.md says how to fill DIR)"


class CarryError(Exception):
    """What is missing or wrong in the carry, with the fix: device.sh prints it as one `error:` line, exit 2."""


def carry_dir() -> Path:
    return Path(os.environ.get("DEVCARRY") or ROOT / ".devcarry")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what travels with every call besides the carry: tracked files and untracked, unignored ones."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return 4 * MIB  # not a checkout: assume a tree of this project's size
    return sum((root / p).stat().st_size for p in out.decode().split("\0") if p and (root / p).is_file())


def call_budget(tree: int | None = None) -> int:
    """What one call's carry may hold: the limit less the working tree and a safety margin."""
    tree = tree_bytes() if tree is None else tree
    return CALL_LIMIT - tree - SAFETY


# ------------------------------------------------------------------------------------------- expect
def expect_tier_a(carry: Path) -> list[str]:
    """What tier A lacks in `carry` (empty: all there)."""
    missing = []
    wheels = [p.name.lower() for p in (carry / "whl").glob("*.whl")]
    for prefix in TIER_A_WHEELS:
        if not any(w.startswith(prefix) for w in wheels):
            missing.append(f"{carry}/whl/{prefix}-*.whl")
    missing += [str(carry / name) for name in TIER_A_MEGATRON if not (carry / name).is_file()]
    return missing


def expect_tier_b(carry: Path, call: int | None = None) -> list[str]:
    """What tier B lacks: every call's files (on the staging machine), or call `call`'s only (on the device,
    where only that call's folder, manifest included, arrived)."""
    root = carry / "tier-b"
    where = root if call is None else root / f"call-{call}"
    if not (where / "manifest.json").is_file():
        hint = STAGE_HELP if call is None else f'carry [".devcarry/tier-b/call-{call}"], staged by {STAGE_HELP}'
        return [f"{where}/manifest.json ({hint})"]
    manifest = load_manifest(where / "manifest.json")
    calls = [c for c in manifest["calls"] if call is None or c["call"] == call]
    if call is not None and not calls:
        return [f"call {call} (the manifest has calls 1-{len(manifest['calls'])})"]
    missing = []
    for c in calls:
        folder = root / f"call-{c['call']}"
        for f in c["files"]:
            p = folder / f["name"]
            if not p.is_file() or p.stat().st_size != f["bytes"]:
                missing.append(str(p))
    return missing


# -------------------------------------------------------------------------------------------- stage
@dataclass(frozen=True)
class Item:
    path: Path
    kind: str  # wheel | sdist | tarball | text | piece


def tier_b_inputs(src: Path, carry: Path) -> tuple[list[Item], Path]:
    """(every small item, the core wheel) that tier B carries: TE's pure wheel, torch sdist and deps from
    `src`, plus tier A's wheels and Megatron tarball from `carry` (the V4 run needs them too)."""

    def one(pattern: str, what: str) -> Path:
        found = sorted(src.glob(pattern))
        if not found:
            raise CarryError(f"no {what} ({pattern}) in {src}: download it there first (docs/gpu.md)")
        return found[-1]

    core = one(f"{TE_CORE}-{TE_VERSION}-*.whl", "Transformer Engine CUDA 13 core wheel")
    items = [Item(one(f"{TE_PURE}{TE_VERSION}-*.whl", "Transformer Engine wheel"), "wheel")]
    items.append(Item(one(f"{TE_TORCH_SDIST}-{TE_VERSION}.tar.gz", "transformer_engine_torch sdist"), "sdist"))
    items += [Item(one(f"{dep}*.whl", f"dependency {dep}"), "wheel") for dep in TE_DEPS]
    missing = expect_tier_a(carry)
    if missing:
        raise CarryError(f"tier B carries tier A's files too; missing: {', '.join(missing)}")
    items += [Item(p, "wheel") for p in sorted((carry / "whl").glob("*.whl"))]
    items += [Item(carry / TIER_A_MEGATRON[0], "tarball"), Item(carry / TIER_A_MEGATRON[1], "text")]
    return items, core


def stage_tier_b(src: Path, carry: Path, budget: int | None = None) -> dict:
    """Pack tier B into calls of at most `budget` bytes each (default: call_budget()): the small items first
    (call 1 starts the torch extension's build with them), then the core wheel cut into pieces that fill
    each call, none over PIECE_MAX. Writes carry/tier-b/{manifest.json, call-<K>/}; returns the manifest."""
    budget = call_budget() if budget is None else budget
    items, core = tier_b_inputs(src, carry)
    root = carry / "tier-b"
    if root.exists():
        shutil.rmtree(root)
    calls: list[list[dict]] = [[]]
    room = budget

    def add(path: Path, kind: str, name: str | None = None, data: bytes | None = None) -> None:
        nonlocal room
        size = len(data) if data is not None else path.stat().st_size
        if size > room:
            calls.append([])
            room = budget
        if size > room:
            raise CarryError(f"{path.name} ({size} B) does not fit one call ({budget} B): raise the budget")
        folder = root / f"call-{len(calls)}"
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / (name or path.name)
        if data is not None:
            out.write_bytes(data)
        else:
            shutil.copyfile(path, out)
        calls[-1].append({"name": out.name, "bytes": size, "sha256": sha256(out), "kind": kind})
        room -= size

    for it in items:
        add(it.path, it.kind)
    parts = []
    with open(core, "rb") as f:
        while True:
            take = min(PIECE_MAX, room if room > MIB else budget)
            data = f.read(take)
            if not data:
                break
            name = f"{core.name}.part{len(parts) + 1:02d}"
            add(core, "piece", name=name, data=data)
            parts.append(name)
    manifest = {
        "tier": "b",
        "budget_bytes": budget,
        "wheel": {"name": core.name, "bytes": core.stat().st_size, "sha256": sha256(core), "parts": parts},
        "calls": [{"call": i + 1, "files": files} for i, files in enumerate(calls)],
    }
    text = json.dumps(manifest, indent=1)
    (root / "manifest.json").write_text(text)
    for i in range(len(calls)):  # every call carries the manifest: the device checks each piece against it
        (root / f"call-{i + 1}" / "manifest.json").write_text(text)
    return manifest


def load_manifest(path: Path) -> dict:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise CarryError(f"cannot read {path} ({exc}): {STAGE_HELP}") from None


# ------------------------------------------------------------------------------------------- device
def receive(call: int, carried: Path, store: Path) -> dict:
    """On the device: check call `call`'s files against the manifest (size, sha256) and move them into
    `store`, where the earlier calls' files must already be (the machine stayed warm). Returns a status."""
    manifest = load_manifest(carried / "manifest.json")
    total = len(manifest["calls"])
    if not 1 <= call <= total:
        raise CarryError(f"call {call} is not in the manifest (calls 1-{total})")
    store.mkdir(parents=True, exist_ok=True)
    lost = [
        f["name"]
        for c in manifest["calls"][: call - 1]
        for f in c["files"]
        if not (store / f["name"]).is_file() or (store / f["name"]).stat().st_size != f["bytes"]
    ]
    if lost:
        raise CarryError(
            f"the device lost {len(lost)} file(s) of calls 1-{call - 1} (e.g. {lost[0]}): it went cold between "
            "calls (over 30 s): start again with call 1"
        )
    for f in manifest["calls"][call - 1]["files"]:
        p = carried / f["name"]
        if not p.is_file():
            raise CarryError(f'call {call} did not carry {f["name"]}: carry [".devcarry/tier-b/call-{call}"]')
        if p.stat().st_size != f["bytes"] or sha256(p) != f["sha256"]:
            raise CarryError(f"{f['name']} arrived damaged (size or sha256 differs): stage tier B again")
        shutil.copyfile(p, store / f["name"])
    (store / "manifest.json").write_text(json.dumps(manifest))
    return {
        "call": call,
        "of": total,
        "last": call == total,
        "files": [f["name"] for f in manifest["calls"][call - 1]["files"]],
    }


def assemble(store: Path) -> Path:
    """Reassemble the core wheel from its pieces in `store`; its sha256 must be the manifest's."""
    manifest = load_manifest(store / "manifest.json")
    w = manifest["wheel"]
    out = store / w["name"]
    with open(out, "wb") as dst:
        for part in w["parts"]:
            with open(store / part, "rb") as src:
                shutil.copyfileobj(src, dst, 8 << 20)
    if out.stat().st_size != w["bytes"] or sha256(out) != w["sha256"]:
        out.unlink()
        raise CarryError(f"{w['name']} reassembled to a different file (size or sha256): stage tier B again")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("expect")
    e.add_argument("tier", choices=("tier-a", "tier-b"))
    e.add_argument("--call", type=int)
    s = sub.add_parser("stage")
    s.add_argument("tier", choices=("tier-b",))
    s.add_argument("--from", dest="src", required=True, type=Path)
    s.add_argument("--budget-bytes", type=int)
    r = sub.add_parser("receive")
    r.add_argument("call", type=int)
    r.add_argument("--carried", type=Path, help="the call's folder (default .devcarry/tier-b/call-K)")
    r.add_argument("--store", type=Path, required=True)
    a = sub.add_parser("assemble")
    a.add_argument("--store", type=Path, required=True)
    args = ap.parse_args(argv)
    carry = carry_dir()
    try:
        if args.cmd == "expect":
            missing = expect_tier_a(carry) if args.tier == "tier-a" else expect_tier_b(carry, args.call)
            if missing:
                hint = "" if args.tier == "tier-b" else " (docs/gpu.md: staging the carry)"
                raise CarryError(f"{args.tier} needs {', '.join(missing)}{hint}")
            print(f"{args.tier}: everything expected is in {carry}")
        elif args.cmd == "stage":
            m = stage_tier_b(args.src, carry, args.budget_bytes)
            for c in m["calls"]:
                size = sum(f["bytes"] for f in c["files"])
                where = carry / "tier-b" / f"call-{c['call']}"
                print(f"call {c['call']}: {len(c['files'])} file(s), {size / MIB:.1f} MiB -> {where}")
        elif args.cmd == "receive":
            carried = args.carried or carry / "tier-b" / f"call-{args.call}"
            print(json.dumps(receive(args.call, carried, args.store)))
        else:
            print(assemble(args.store))
    except CarryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
