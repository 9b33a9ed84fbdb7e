"""What a rank ran with, as its node saw it: versions, the Megatron commit, the container, the perf env.

Why on the node: the login node's packages are not the container's, and a hand-tuned recipe loses exactly
this (which Transformer Engine, which NCCL, which NCCL_*/NVTE_* settings). Each evidence rank's sidecar
carries `facts()`; orchestrator.evidence.metrics puts them into the JobResult (versions, run_env) and the
ledger keeps them beside the measurement (orchestrator.evidence.bundle shows them with a winner).

Stdlib at module level; torch is imported inside, and only read when the workload already imported it.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.core import stack
from orchestrator.job import checkout

# The environment that changes how a job communicates or computes (what the bundle shows and a rerun needs).
ENV_PREFIXES = ("NCCL_", "NVTE_", "TORCH_NCCL_", "NVSHMEM_", "UCX_", "CUDNN_")
ENV_NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS")
CONTAINER_ENV = "ORCH_CONTAINER_IMAGE"  # the image the launcher started the task in (runspec sets it)
_PINNED = re.compile(r"@(sha256:[0-9a-f]{64})$")
SIMULATED = "simulated"  # the twin's value for what a real node would report


def run_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The perf-relevant environment variables (ENV_PREFIXES, ENV_NAMES) of this process, sorted by name."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def _dist(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return None


def versions(megatron_root: str | Path | None = None) -> dict[str, str]:
    """Versions of what this rank runs: torch, CUDA, NCCL, Transformer Engine, DeepEP, megatron-core's
    package_info, the checkout's git commit, the container image and its pinned digest (absent ones omitted)."""
    out: dict[str, str | None] = {
        "transformer_engine": _dist(*stack.component("transformer_engine").dists),
        "deep_ep": _dist(*stack.component("deep_ep").dists),
        "megatron_commit": checkout.git_commit(megatron_root) if megatron_root else None,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(torch.__version__)
        out["cuda"] = str(torch.version.cuda) if torch.version.cuda else None
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    core = sys.modules.get("megatron.core.package_info")
    if core is not None:
        out["megatron_core"] = str(getattr(core, "__version__", "")) or None
    image = os.environ.get(CONTAINER_ENV)
    if image:
        out["container_image"] = image
        pinned = _PINNED.search(image)
        out["container_digest"] = pinned.group(1) if pinned else None
    return {k: v for k, v in out.items() if v}


def facts(megatron_root: str | Path | None = None) -> dict[str, Any]:
    """The sidecar's part about this node: {"node", "versions", "env"}."""
    node = (os.environ.get("SLURMD_NODENAME") or socket.gethostname()).split(".")[0]
    return {"node": node, "versions": versions(megatron_root), "env": run_env()}


def simulated_facts() -> dict[str, Any]:
    """The twin's part: what a real node would report, each version marked simulated (the env is the one the
    twin process really got: the spec's)."""
    names = ("torch", "megatron_commit", "transformer_engine", "deep_ep", "nccl")
    node = (os.environ.get("SLURMD_NODENAME") or socket.gethostname()).split(".")[0]
    return {"node": node, "versions": dict.fromkeys(names, SIMULATED), "env": run_env()}
