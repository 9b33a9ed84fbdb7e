"""The preflight job: on one node, inside the container when one is set, check what real Megatron needs.

Why a job and not a check on the login node: the login node's Python, torch and packages are not the
container's, and only a compute node has the GPUs and NCCL. Rank 0 runs every check, validates every
candidate's argv with Megatron's own parser, and writes `preflight.json` (JobPaths.preflight); the
orchestrator (orchestrator/preflight.py) adds the Slurm rows and prints one table.

Megatron's dev branch (orchestrator.core.megatron.TESTED_COMMIT) is the only place the V4 path lives; each
module below is named with the file and line that defines it there. A file is checked on disk (with its
defining line), not imported: importing megatron.core on a machine without its kernels fails for unrelated
reasons. Stdlib only at module level: torch, megatron and the kernels are imported inside the checks.

The checkout's commit is read from its git metadata (orchestrator.job.checkout) and recorded in the report:
the tested commit passes, another one is a warning naming both, a checkout without git metadata fails (no
run could say which Megatron it measured). The fixes orchestrator.job.checkout detects in the checkout's code
lift the legality rules they remove (`lifted`: the sweep plans with them, orchestrator.plan.rules).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.core import stack
from orchestrator.core.megatron import TESTED, TESTED_COMMIT, short
from orchestrator.core.paths import JobPaths, atomic_write
from orchestrator.job import checkout as checkout_mod
from orchestrator.job import probe_mode
from orchestrator.plan import probe

MIN_PYTHON = (3, 11)  # this project's job code (pyproject.toml requires-python); Megatron-LM needs >= 3.10
MIN_TE = (2, 9)  # megatron/core/transformer/transformer_config.py:3680 (sequence packing needs TE >= 2.9.0)
# --moe-router-fusion with --moe-router-score-function sqrtsoftplus raises below TE 2.13
# (megatron/core/transformer/moe/moe_utils.py:742-745 at dev d48bd6be0a85)
MIN_TE_ROUTER_FUSION_SQRTSOFTPLUS = (2, 13)
# Every CSA (ratio 4) layer's indexer rotates its activations with fast_hadamard_transform and asserts it is
# installed (megatron/core/transformer/experimental_attention_variant/dsa.py:30-34,264-269; csa.py:1192,1374,1591)
HADAMARD = stack.component("fast_hadamard_transform").module
TORCH_ROW, NCCL_ROW = stack.component("torch").what, stack.component("nccl").what
TE_ROW = stack.component("transformer_engine").what
IMAGE_FIX = f"build the image of {stack.RECIPE} (docs/cluster.md section 9), which installs it"


class CheckStatus(StrEnum):
    PASS = "pass"
    WARN = "warn"  # not blocking: the answer was missing or the risk is the user's to take
    FAIL = "fail"


@dataclass(frozen=True)
class V4Module:
    """A dev-branch piece the V4 path needs: its file under the checkout and the line that defines it."""

    what: str
    path: str
    defines: str
    source: str


V4_MODULES = (
    V4Module(
        "dsv4_hybrid attention (CSA/HCA)",
        "megatron/core/transformer/experimental_attention_variant/deepseek_v4_hybrid_attention.py",
        "class DSv4HybridSelfAttention",
        "deepseek_v4_hybrid_attention.py:483",
    ),
    V4Module(
        "hyper-connections (mHC)",
        "megatron/core/transformer/hyper_connection.py",
        "class HyperConnectionModule",
        "hyper_connection.py:216",
    ),
    V4Module("hash routing", "megatron/core/transformer/moe/router.py", "def _hash_routing", "moe/router.py:729"),
    V4Module(
        "hybrid DSv4 layer spec",
        "megatron/core/models/hybrid/hybrid_layer_specs.py",
        "def hybrid_dsv4_stack_spec",
        "hybrid_layer_specs.py:325",
    ),
    V4Module(
        "CP partition layout (packed THD)",
        "megatron/core/context_parallel_layout/routes.py",
        "def prebuild_thd_cp_partition_routes",
        "context_parallel_layout/routes.py:257",
    ),
)


@dataclass
class Check:
    """One row of the preflight table."""

    name: str
    status: CheckStatus
    detail: str
    fix: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Check:
        return cls(d["name"], CheckStatus(d["status"]), d.get("detail", ""), d.get("fix", ""))


@dataclass
class CandidateArgv:
    key: str
    argv: list[str]  # the candidate's flags + workload.extra_args, as the job gets them
    world: int  # N
    env: dict[str, str] = field(default_factory=dict)  # the job's environment (JobSpec.env): validate_args reads it


@dataclass
class PreflightRequest:
    """What the orchestrator asks the preflight job to check."""

    entry_script: str  # workload.command's .py: its folder is the Megatron checkout
    gpus_per_node: int
    candidates: list[CandidateArgv] = field(default_factory=list)
    flex_backends: list[str] = field(default_factory=list)  # deepep / hybridep when flex is in the space
    cudnn_dsa: bool = False  # --dsa-kernel-backend cudnn
    muon: bool = False  # --optimizer muon (emerging_optimizers)
    packed_cp: bool = False  # packed THD input with CP > 1 somewhere in the space (TE >= 2.9)
    router_fusion_sqrtsoftplus: bool = False  # --moe-router-fusion with sqrtsoftplus scores (TE >= 2.13)
    csa: bool = False  # a CSA (ratio 4, 'C') layer in some candidate's pattern: fast_hadamard_transform
    probe_mode: str | None = None  # the mode the sweep's rank probes install (orchestrator/job/probe_mode.py)


@dataclass
class PreflightReport:
    checks: list[Check]
    rejected: dict[str, str]  # candidate key -> Megatron's message
    # the node's checkout: {"commit", "tested_commit", "path"} (orchestrator.job.checkout)
    megatron: dict[str, Any] = field(default_factory=dict)
    lifted: list[str] = field(default_factory=list)  # rule ids whose Megatron fix the checkout carries

    def save(self, job_dir: str | os.PathLike) -> Path:
        doc = {
            "checks": [asdict(c) for c in self.checks],
            "rejected": self.rejected,
            "megatron": self.megatron,
            "lifted": self.lifted,
        }
        return atomic_write(JobPaths(job_dir).preflight, json.dumps(doc, indent=1))

    @classmethod
    def load(cls, job_dir: str | os.PathLike) -> PreflightReport:
        doc = json.loads(JobPaths(job_dir).preflight.read_text())
        return cls(
            [Check.from_dict(c) for c in doc["checks"]],
            dict(doc["rejected"]),
            dict(doc.get("megatron") or {}),
            list(doc.get("lifted") or []),
        )


def run(request: PreflightRequest, job_dir: str) -> dict[str, Any]:
    """The job function: rank 0 checks and writes the report; the other tasks of the node only start."""
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return {}
    report = check(request)
    report.save(job_dir)
    return {"failed": [c.name for c in report.checks if c.status is CheckStatus.FAIL]}


def check(request: PreflightRequest) -> PreflightReport:
    """Every row of this node: the environment, the checkout (commit, V4 modules, fixes), Megatron's verdicts."""
    checks = environment_checks(request)
    roots, checkout = megatron_roots(request.entry_script)
    commit_row, commit = commit_check(roots[0] if checkout else None)
    checks += [*v4_module_checks(roots, checkout), commit_row]
    fix_rows, lifted = fix_checks(roots[0] if checkout else None)
    checks += fix_rows
    if request.probe_mode:
        checks.append(probe_mode_check(request.probe_mode, roots[0] if checkout else None))
    summary, rejected = validate_candidates(request, roots if checkout else [])
    megatron = {
        "commit": commit,
        "tested_commit": TESTED_COMMIT,
        "path": str(roots[0]) if checkout else None,
    }
    return PreflightReport([*checks, summary], rejected, megatron, lifted)


def probe_mode_check(mode: str, root: Path | None) -> Check:
    """The rank probes' mode can install here: every Megatron code point it changes is where it expects it
    (probe_mode.check_tree, read from the checkout's files) and torch has the fake backend dev's
    --fake-process-group starts (initialize.py:343-350)."""
    name = f"probe mode {mode}"
    fix = f"use {TESTED} or set workload.probe_mode={probe.OFF} (the probes then run dev's fake process group as is)"
    if root is None:
        return Check(name, CheckStatus.FAIL, "no checkout to read its code points from", fix)
    problems = probe_mode.check_tree(root)
    if problems:
        return Check(name, CheckStatus.FAIL, f"{len(problems)} code point(s) moved: {problems[0]}", fix)
    try:
        import torch.distributed as dist

        fake = "fake" in {str(b) for b in dist.Backend.backend_list}
    except Exception as exc:  # noqa: BLE001 - no torch here: what the rows above say
        return Check(name, CheckStatus.FAIL, f"torch: {type(exc).__name__}: {exc}", fix)
    if not fake:
        return Check(name, CheckStatus.FAIL, "torch has no 'fake' process-group backend", fix)
    points = ", ".join(f"{p.cls}.{p.method}" for p in probe_mode.POINTS)
    return Check(name, CheckStatus.PASS, f"its {len(probe_mode.POINTS)} code points are in place ({points})")


def commit_check(root: Path | None) -> tuple[Check, str | None]:
    """(the row, the commit): the checkout's commit against the tested one."""
    name = "Megatron commit"
    if root is None:
        return Check(name, CheckStatus.FAIL, "no checkout", "see the Megatron checkout row"), None
    commit = checkout_mod.git_commit(root)
    if commit is None:
        return Check(
            name,
            CheckStatus.FAIL,
            f"{root} has no git metadata: the commit every result would be measured with is unrecorded",
            f"mount a git checkout of Megatron-LM (git clone, with its .git), e.g. {TESTED} "
            f"(git checkout {TESTED_COMMIT})",
        ), None
    if checkout_mod.is_tested(commit):
        return Check(name, CheckStatus.PASS, f"{commit} ({TESTED}, the tested commit)"), commit
    return Check(
        name,
        CheckStatus.WARN,
        f"{commit} is not the tested commit {TESTED_COMMIT} ({TESTED}): the flags, rules and checks were "
        f"verified against {short(TESTED_COMMIT)}, this cluster runs {short(commit)}",
        f"check out {TESTED_COMMIT} in the checkout, or accept that {short(commit)} may differ",
    ), commit


def fix_checks(root: Path | None) -> tuple[list[Check], list[str]]:
    """One row per known Megatron fix (orchestrator.job.checkout.FIXES): found, it lifts its legality rule."""
    rows, lifted = [], []
    for rule, (what, detect) in checkout_mod.FIXES.items():
        found = detect(root) if root is not None else None
        if found:
            lifted.append(rule)
            rows.append(Check(f"Megatron fix: {what}", CheckStatus.PASS, f"found in the checkout: rule {rule} lifted"))
        else:
            why = "not found in the checkout" if found is False else "cannot tell (no checkout, or no such code)"
            rows.append(
                Check(
                    f"Megatron fix: {what}",
                    CheckStatus.WARN,
                    f"{why}: rule {rule} holds (those layouts are not planned)",
                    "apply the fix to the checkout to plan them",
                )
            )
    return rows, lifted


def _version(*dists: str) -> str | None:
    for dist in dists:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return None


def _at_least(version: str, minimum: tuple[int, ...]) -> bool:
    parts = []
    for piece in version.split(".")[: len(minimum)]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= minimum


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# Preflight-lite: what a real Megatron job on THIS host needs before it is worth launching (seconds, no job).
LITE_MODULES = ("torch", "transformer_engine")  # imported by pretrain_hybrid.py before any work is done


def lite(entry_script: str) -> list[str]:
    """What this host lacks for a real Megatron job (cluster=local: the job runs here): the checkout's entry
    script, its `megatron` package, the modules it imports first. Found on disk (find_spec), never imported;
    [] when nothing is missing. The full check is the preflight job (`run`)."""
    problems = []
    if not os.path.isfile(entry_script):
        problems.append(f"no Megatron-LM checkout: {entry_script} does not exist")
    else:
        roots, _ = megatron_roots(entry_script)
        if not any((r / "megatron" / "core").is_dir() for r in roots):
            problems.append(f"no megatron/core beside {entry_script} nor an installed megatron-core")
    missing = [m for m in LITE_MODULES if not _found(m)]
    if missing:
        problems.append(f"Python module(s) {', '.join(missing)} not importable by {sys.executable}")
    return problems


def environment_checks(req: PreflightRequest) -> list[Check]:
    """Python, torch + CUDA, GPUs of this node, NCCL, Transformer Engine, and the optional kernels."""
    py = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info[:2] >= MIN_PYTHON
    out = [
        Check(
            stack.component("python").what,
            CheckStatus.PASS if ok else CheckStatus.FAIL,
            f"{py} ({sys.executable})",
            ""
            if ok
            else "use an image whose Python is >= 3.11 (this project's job code needs it); set cluster.slurm.python",
        )
    ]
    out += _torch_checks(req)
    te = stack.component("transformer_engine")
    out.append(te_check(req, _version(*te.dists)))
    for c in needed(req):
        if c.key in KERNEL_CHECKS:
            out += KERNEL_CHECKS[c.key](req)
    return out


def needed(req: PreflightRequest) -> list[stack.Component]:
    """The manifest's components (orchestrator.core.stack) the request's space needs on the node, in manifest
    order: the base image's Python, torch and NCCL, the Megatron checkout and Transformer Engine always; the
    kernels only where some candidate runs them. Each has a row (KERNEL_CHECKS or the rows above)."""
    keys = {"python", "torch", "nccl", "megatron", "transformer_engine"}
    if req.csa:
        keys.add("fast_hadamard_transform")
    if req.flex_backends:
        keys.add("deep_ep")
    if req.cudnn_dsa:
        keys |= {"flash_mla", "cudnn_frontend"}
    if req.muon:
        keys.add("emerging_optimizers")
    return [c for c in stack.COMPONENTS if c.key in keys]


def component_check(c: stack.Component, why: str, fix: str, *, attr: str | None = None, name: str = "") -> Check:
    """A kernel of the manifest on this node: its module imports, has the attribute the V4 path calls (`attr`,
    default the manifest's), and reports the pinned release; another release is a warning naming both."""
    name = name or c.what
    attr = c.attr if attr is None else attr
    fix = f"{fix}; or {IMAGE_FIX}"
    try:
        module = importlib.import_module(c.module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return Check(name, CheckStatus.FAIL, f"import {c.module}: {type(exc).__name__}: {exc}; {why}", fix)
    if attr and not hasattr(module, attr):
        return Check(name, CheckStatus.FAIL, f"{c.module} has no {attr}; {why}", fix)
    found = _version(*c.dists)
    if found and c.release and stack.release(found)[: len(c.release)] != c.release:
        return Check(
            name,
            CheckStatus.WARN,
            f"{found}, not the pinned {c.version} ({stack.RECIPE}): the tested stack differs",
            f"accept it, or {IMAGE_FIX}",
        )
    return Check(name, CheckStatus.PASS, found or "found")


def te_floor(req: PreflightRequest) -> tuple[tuple[int, ...], str, str]:
    """(the lowest Transformer Engine the space runs on, why, the fix that lowers it)."""
    floor, why, fix = MIN_TE, "the V4 path", ""
    if req.packed_cp:
        why, fix = "packed THD with CP > 1 (transformer_config.py:3680)", "or search cp: [1] only"
    if req.router_fusion_sqrtsoftplus:
        floor = MIN_TE_ROUTER_FUSION_SQRTSOFTPLUS
        why = "--moe-router-fusion with sqrtsoftplus scores (moe_utils.py:742-745)"
        fix = "or set workload.recipe.moe_router_fusion=false"
    return floor, why, fix


def te_check(req: PreflightRequest, te: str | None) -> Check:
    """Transformer Engine installed, at the floor the space needs (te_floor)."""
    floor, why, fix = te_floor(req)
    need = ".".join(map(str, floor))
    if te is None:
        return Check(
            TE_ROW,
            CheckStatus.FAIL,
            "not installed",
            f"use an image with Transformer Engine >= {need} (NGC PyTorch images ship it)",
        )
    if not _at_least(te, floor):
        return Check(
            TE_ROW,
            CheckStatus.FAIL,
            f"{te}: {why} needs >= {need}",
            f"upgrade Transformer Engine to >= {need}" + (f", {fix}" if fix else ""),
        )
    pin = stack.component("transformer_engine").version  # another TE above the floor runs: the row says which
    return Check(TE_ROW, CheckStatus.PASS, f"{te} (>= {need}: {why}; {stack.RECIPE} pins {pin})")


def hadamard_check() -> Check:
    """fast_hadamard_transform importable with its kernel: every CSA (ratio 4) layer calls it."""
    c = stack.component("fast_hadamard_transform")
    return component_check(
        c,
        "every CSA layer's indexer calls hadamard_transform (dsa.py:264-269 asserts it is installed)",
        f"build {HADAMARD} into the image from its git repository ({c.git} at {c.rev[:12]}, on a machine with "
        "CUDA and network); its sdist on the package index is a stub that downloads the kernel at build time, "
        "so `pip install fast-hadamard-transform` fails on an offline node",
    )


def _torch_checks(req: PreflightRequest) -> list[Check]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return [
            Check(
                TORCH_ROW,
                CheckStatus.FAIL,
                f"import torch failed: {exc}",
                "use an image with a CUDA build of PyTorch (e.g. NGC pytorch)",
            )
        ]
    cuda = torch.version.cuda
    if not torch.cuda.is_available():
        return [
            Check(
                TORCH_ROW,
                CheckStatus.FAIL,
                f"torch {torch.__version__}, CUDA build {cuda}: no GPU visible",
                "run preflight on a GPU node (cluster=slurm) with an image whose torch has CUDA",
            )
        ]
    out = [Check(TORCH_ROW, CheckStatus.PASS, f"torch {torch.__version__}, CUDA {cuda}")]
    count = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    ok = count == req.gpus_per_node
    out.append(
        Check(
            "GPUs per node",
            CheckStatus.PASS if ok else CheckStatus.FAIL,
            f"{count} x {', '.join(names)}",
            "" if ok else f"stage.gpus_per_node={req.gpus_per_node}: set it to {count} or use other nodes",
        )
    )
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        out.append(Check(NCCL_ROW, CheckStatus.PASS, nccl))
    except Exception as exc:  # noqa: BLE001
        out.append(Check(NCCL_ROW, CheckStatus.FAIL, f"no NCCL in torch: {exc}", "use a torch build with NCCL"))
    return out


def _deepep_checks(req: PreflightRequest) -> list[Check]:
    """One row per flex backend: deep_ep imports, and the hybridep backend finds HybridEPBuffer
    (moe/fused_a2a.py:494), which only DeepEP's hybrid-ep branch has."""
    c = stack.component("deep_ep")
    return [
        component_check(
            c,
            f"the flex dispatcher's {backend} backend",
            "install DeepEP's hybrid-ep branch, or drop flex:hybridep from stage.search.dispatcher"
            if backend == "hybridep"
            else "install DeepEP in the image, or drop flex:* from stage.search.dispatcher",
            attr=c.attr if backend == "hybridep" else "",
            name=f"{c.what}: {backend}",
        )
        for backend in req.flex_backends
    ]


DSA_FIX = "or choose another --dsa-kernel-backend"


def _flash_mla_check(req: PreflightRequest) -> list[Check]:
    """--dsa-kernel-backend cudnn: FlashMLA's nv_dev sparse kernels."""
    c = stack.component("flash_mla")
    why = "--dsa-kernel-backend cudnn uses FlashMLA's sparse kernels"
    return [component_check(c, why, f"install FlashMLA's nv_dev branch in the image, {DSA_FIX}")]


def _cudnn_dsa_check(req: PreflightRequest) -> list[Check]:
    """--dsa-kernel-backend cudnn: the cuDNN frontend's DSA namespace."""
    c = stack.component("cudnn_frontend")
    fix = f"install a cudnn-frontend with the DSA namespace (nvidia-cudnn-frontend) in the image, {DSA_FIX}"
    return [component_check(c, "dsa_cudnn_kernels.py:960 does `from cudnn import DSA`", fix)]


def _muon_check(req: PreflightRequest) -> list[Check]:
    return [
        component_check(
            stack.component("emerging_optimizers"),
            "megatron/core/optimizer/emerging_optimizers.py imports it",
            "pip install emerging-optimizers in the image, or model.optimizer=adam",
        )
    ]


# The manifest's kernels and the rows that check them (the base image's, Megatron's and TE's rows are above).
KERNEL_CHECKS: dict[str, Callable[[PreflightRequest], list[Check]]] = {
    "fast_hadamard_transform": lambda req: [hadamard_check()],
    "deep_ep": _deepep_checks,
    "flash_mla": _flash_mla_check,
    "cudnn_frontend": _cudnn_dsa_check,
    "emerging_optimizers": _muon_check,
}


def megatron_roots(entry_script: str) -> tuple[list[Path], bool]:
    """(folders holding `megatron/`, whether it is a checkout): the entry script's folder when it exists,
    else wherever an installed megatron-core put the package (found without importing it)."""
    checkout = Path(entry_script).resolve().parent
    if (checkout / "megatron").is_dir():
        return [checkout], True
    try:
        spec = importlib.util.find_spec("megatron")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return [Path(loc).parent for loc in locations], False


def v4_module_checks(roots: list[Path], checkout: bool) -> list[Check]:
    where = ", ".join(str(r) for r in roots) or "nowhere"
    out = [
        Check(
            "Megatron checkout",
            CheckStatus.PASS if checkout else CheckStatus.FAIL,
            str(roots[0]) if checkout else f"no checkout at the entry script's folder; megatron found in {where}",
            ""
            if checkout
            else "mount a Megatron-LM dev checkout (cluster.slurm.container.mounts) and point "
            "workload.command at its pretrain_hybrid.py",
        )
    ]
    for mod in V4_MODULES:
        files = [r / mod.path for r in roots if (r / mod.path).is_file()]
        ok = any(mod.defines in f.read_text(errors="replace") for f in files)
        detail = f"{mod.path} ({mod.defines}; dev {mod.source})"
        out.append(
            Check(
                f"V4: {mod.what}",
                CheckStatus.PASS if ok else CheckStatus.FAIL,
                detail,
                "" if ok else f"missing in {where}: use Megatron-LM's dev branch (it has {mod.path})",
            )
        )
    return out


def validate_candidate_argv(
    argv: list[str], world: int, env: dict[str, str] | None = None, te_version: str | None = None
) -> str | None:
    """Megatron's own verdict on one candidate, None when accepted, else Megatron's message: the
    training-ready check (orchestrator.job.megatron_check: parse_args + validate_args in the job's `env`, the
    optimizer config and the LR scheduler as pretrain builds them, and the TransformerConfig where CUDA
    answers). te_version: the Transformer Engine Megatron sees (None: this node's). Strict: the node's Megatron
    gets the argv as the job will, no dev-only flag dropped for a parser that lacks the V4 path."""
    from orchestrator.job.megatron_check import check_candidate

    return check_candidate(argv, world, env=env, te_version=te_version, strict=True)


def validate_candidates(
    req: PreflightRequest, checkout: list[Path], *, te_version: str | None = None
) -> tuple[Check, dict[str, str]]:
    """Megatron's verdict on every candidate (the checkout first on sys.path); a rejected one is never launched.
    te_version: the Transformer Engine Megatron sees (None: this node's; a CPU test names the node's)."""
    name = f"Megatron accepts the {len(req.candidates)} candidates"
    for root in reversed(checkout):
        sys.path.insert(0, str(root))
    try:
        importlib.import_module("megatron.training.arguments")
    except Exception as exc:  # noqa: BLE001
        return Check(
            name,
            CheckStatus.FAIL,
            f"cannot import megatron.training.arguments: {type(exc).__name__}: {exc}",
            "fix the Megatron checkout / image (the rows above say what is missing)",
        ), {}
    rejected = {}
    for cand in req.candidates:
        verdict = validate_candidate_argv(cand.argv, cand.world, cand.env, te_version)
        if verdict is not None:
            rejected[cand.key] = verdict
    accepted = len(req.candidates) - len(rejected)
    detail = f"{accepted} accepted, {len(rejected)} rejected (never launched)"
    if rejected:
        detail += f"; e.g. {next(iter(rejected))[:10]}: {next(iter(rejected.values()))[:200]}"
    status = CheckStatus.FAIL if accepted == 0 else CheckStatus.WARN if rejected else CheckStatus.PASS
    return Check(
        name, status, detail, "" if accepted else "fix the flags Megatron rejects (plan --argv INDEX)"
    ), rejected
