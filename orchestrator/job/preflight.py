"""The preflight job: on one node, inside the container when one is set, check what real Megatron needs.

Why a job and not a check on the login node: the login node's Python, torch and packages are not the
container's, and only a compute node has the GPUs and NCCL. Rank 0 runs every check, validates every
candidate's argv with Megatron's own parser, and writes `preflight.json` (JobPaths.preflight); the
orchestrator (orchestrator/preflight.py) adds the Slurm rows and prints one table.

Megatron's dev branch (commit d48bd6be0a85) is the only place the V4 path lives; each module below is
named with the file and line that defines it there. A file is checked on disk (with its defining line),
not imported: importing megatron.core on a machine without its kernels fails for unrelated reasons.
Stdlib only at module level: torch, megatron and the kernels are imported inside the checks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.core.paths import JobPaths, atomic_write

MIN_PYTHON = (3, 11)  # this project's job code (pyproject.toml requires-python); Megatron-LM needs >= 3.10
MIN_TE = (2, 9)  # megatron/core/transformer/transformer_config.py:3680 (sequence packing needs TE >= 2.9.0)


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


@dataclass
class PreflightReport:
    checks: list[Check]
    rejected: dict[str, str]  # candidate key -> Megatron's message

    def save(self, job_dir: str | os.PathLike) -> Path:
        doc = {"checks": [asdict(c) for c in self.checks], "rejected": self.rejected}
        return atomic_write(JobPaths(job_dir).preflight, json.dumps(doc, indent=1))

    @classmethod
    def load(cls, job_dir: str | os.PathLike) -> PreflightReport:
        doc = json.loads(JobPaths(job_dir).preflight.read_text())
        return cls([Check.from_dict(c) for c in doc["checks"]], dict(doc["rejected"]))


def run(request: PreflightRequest, job_dir: str) -> dict[str, Any]:
    """The job function: rank 0 checks and writes the report; the other tasks of the node only start."""
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return {}
    checks = environment_checks(request)
    roots, checkout = megatron_roots(request.entry_script)
    checks += v4_module_checks(roots, checkout)
    summary, rejected = validate_candidates(request, roots if checkout else [])
    report = PreflightReport([*checks, summary], rejected)
    report.save(job_dir)
    return {"failed": [c.name for c in report.checks if c.status is CheckStatus.FAIL]}


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


def environment_checks(req: PreflightRequest) -> list[Check]:
    """Python, torch + CUDA, GPUs of this node, NCCL, Transformer Engine, and the optional kernels."""
    py = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info[:2] >= MIN_PYTHON
    out = [
        Check(
            "Python",
            CheckStatus.PASS if ok else CheckStatus.FAIL,
            f"{py} ({sys.executable})",
            ""
            if ok
            else "use an image whose Python is >= 3.11 (this project's job code needs it); set cluster.slurm.python",
        )
    ]
    out += _torch_checks(req)
    te = _version("transformer_engine", "transformer-engine", "transformer_engine_torch")
    need = ".".join(map(str, MIN_TE))
    if te is None:
        out.append(
            Check(
                "Transformer Engine",
                CheckStatus.FAIL,
                "not installed",
                f"use an image with Transformer Engine >= {need} (NGC PyTorch images ship it)",
            )
        )
    elif req.packed_cp and not _at_least(te, MIN_TE):
        out.append(
            Check(
                "Transformer Engine",
                CheckStatus.FAIL,
                f"{te}: packed THD with CP > 1 needs >= {need}",
                f"upgrade Transformer Engine to >= {need}, or search cp: [1] only",
            )
        )
    else:
        out.append(Check("Transformer Engine", CheckStatus.PASS, te))
    for backend in req.flex_backends:
        out.append(_deepep_check(backend))
    if req.cudnn_dsa:
        out.append(_module_check("flash_mla", "flash_mla", "--dsa-kernel-backend cudnn uses FlashMLA's sparse kernels"))
        out.append(_cudnn_dsa_check())
    if req.muon:
        v = _version("emerging_optimizers", "emerging-optimizers")
        out.append(
            Check(
                "Muon optimizer (emerging_optimizers)",
                CheckStatus.PASS if v else CheckStatus.FAIL,
                v or "not installed (megatron/core/optimizer/emerging_optimizers.py imports it)",
                "" if v else "pip install emerging-optimizers in the image, or model.optimizer=adam",
            )
        )
    return out


def _torch_checks(req: PreflightRequest) -> list[Check]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return [
            Check(
                "torch + CUDA",
                CheckStatus.FAIL,
                f"import torch failed: {exc}",
                "use an image with a CUDA build of PyTorch (e.g. NGC pytorch)",
            )
        ]
    cuda = torch.version.cuda
    if not torch.cuda.is_available():
        return [
            Check(
                "torch + CUDA",
                CheckStatus.FAIL,
                f"torch {torch.__version__}, CUDA build {cuda}: no GPU visible",
                "run preflight on a GPU node (cluster=slurm) with an image whose torch has CUDA",
            )
        ]
    out = [Check("torch + CUDA", CheckStatus.PASS, f"torch {torch.__version__}, CUDA {cuda}")]
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
        out.append(Check("NCCL", CheckStatus.PASS, nccl))
    except Exception as exc:  # noqa: BLE001
        out.append(Check("NCCL", CheckStatus.FAIL, f"no NCCL in torch: {exc}", "use a torch build with NCCL"))
    return out


def _module_check(name: str, module: str, why: str) -> Check:
    ok = _found(module)
    return Check(
        name,
        CheckStatus.PASS if ok else CheckStatus.FAIL,
        _version(module) or ("found" if ok else why),
        "" if ok else f"install {module} in the image, or choose another --dsa-kernel-backend",
    )


def _cudnn_dsa_check() -> Check:
    try:
        importlib.import_module("cudnn").DSA  # noqa: B018 - dsa_cudnn_kernels.py:960 does `from cudnn import DSA`
    except Exception as exc:  # noqa: BLE001
        return Check(
            "cuDNN frontend DSA kernels",
            CheckStatus.FAIL,
            f"from cudnn import DSA: {exc}",
            "install a cudnn-frontend with the DSA namespace (nvidia-cudnn-frontend) in the image",
        )
    return Check("cuDNN frontend DSA kernels", CheckStatus.PASS, _version("nvidia-cudnn-frontend", "cudnn") or "found")


def _deepep_check(backend: str) -> Check:
    name = f"DeepEP ({backend}, flex dispatcher)"
    try:
        deep_ep = importlib.import_module("deep_ep")
    except Exception as exc:  # noqa: BLE001
        return Check(
            name,
            CheckStatus.FAIL,
            f"import deep_ep: {exc}",
            "install DeepEP in the image, or drop flex:* from stage.search.dispatcher",
        )
    if backend == "hybridep" and not hasattr(deep_ep, "HybridEPBuffer"):  # moe/fused_a2a.py:494
        return Check(
            name,
            CheckStatus.FAIL,
            "deep_ep has no HybridEPBuffer",
            "install DeepEP's hybrid-ep branch, or drop flex:hybridep from stage.search.dispatcher",
        )
    return Check(name, CheckStatus.PASS, _version("deep_ep", "deep-ep") or "found")


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


def validate_candidate_argv(argv: list[str], world: int) -> str | None:
    """Megatron's own verdict on one candidate, None when accepted, else Megatron's message: the
    training-ready check (orchestrator.job.megatron_check: parse_args + validate_args, the optimizer config and
    the LR scheduler as pretrain builds them, and the TransformerConfig where CUDA answers)."""
    from orchestrator.job.megatron_check import check_candidate

    return check_candidate(argv, world)


def validate_candidates(req: PreflightRequest, checkout: list[Path]) -> tuple[Check, dict[str, str]]:
    """Megatron's verdict on every candidate (the checkout first on sys.path); a rejected one is never launched."""
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
        verdict = validate_candidate_argv(cand.argv, cand.world)
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
