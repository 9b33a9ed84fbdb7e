"""The software stack a real job runs on: one manifest the container recipe and preflight both read.

Why one list: preflight (orchestrator/job/preflight.py) names what a node must have, and the image recipe
(docker/Dockerfile, rendered from this list by scripts/image.py) installs it; two lists drift, and a cluster
admin then assembles an image by trial and error against preflight. Each `Component` says what it is, the
version it is pinned to, how the recipe installs it (the base image, PyPI, or a git commit) and how preflight
detects it (an import, an attribute the V4 path calls, the distribution metadata that carries its version).
tests/job/test_stack.py checks that every component preflight asks for is installed by the committed recipe at
this version, and that the recipe is this list's rendering.

The pins are Megatron-LM dev's own at the tested commit (orchestrator.core.megatron.TESTED_COMMIT, d48bd6be0a85):
its CI image (docker/Dockerfile.ci.dev, base docker/.ngc_version.dev:1), its pyproject.toml [tool.uv.sources] and
[[tool.uv.dependency-metadata]] (lines 197-230) and uv.lock. A version that no public file states is said to be
unconfirmed in `note`, never guessed. Stdlib only: the preflight job imports it on the node.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from orchestrator.core.megatron import TESTED_COMMIT

BASE, PIP, GIT = "base", "pip", "git"  # how the recipe gets a component


@dataclass(frozen=True)
class Component:
    """One piece of the stack: its pin, how the recipe installs it, how preflight detects it."""

    key: str  # the id preflight and the recipe name it by
    what: str  # the preflight row's name
    install: str  # BASE (ships in the base image), PIP (a PyPI pin) or GIT (a commit of `git`)
    version: str = ""  # the version its distribution reports once installed ("": the base image's own)
    module: str = ""  # the import name preflight detects it by ("": not a Python module)
    dists: tuple[str, ...] = ()  # distribution names whose metadata carries `version`, first found wins
    attr: str = ""  # an attribute of `module` the V4 path calls (a kernel entry point), checked by preflight
    git: str = ""  # GIT: the repository
    rev: str = ""  # GIT: the commit installed (a branch moves; a commit does not)
    branch: str = ""  # GIT: the branch `rev` is on, when it is not the default one
    extras: str = ""  # pip extras of the install ("[pytorch]")
    env: tuple[str, ...] = ()  # NAME=value the build needs
    setup: tuple[str, ...] = ()  # shell lines run in the component's source folder before it is installed
    dest: str = ""  # GIT: where the checkout stays in the image ("": /opt/src/KEY, removed after the install)
    pip_install: bool = True  # GIT: pip-installed from its checkout (Megatron-LM is run from the checkout)
    source: str = ""  # where the pin comes from (public file:line)
    note: str = ""  # what is not confirmed, or why it is needed

    @property
    def release(self) -> tuple[int, ...]:
        """The pinned version's release numbers (2.14.0+f031cf87 -> (2, 14, 0)); () when unpinned."""
        return release(self.version)


def release(version: str | None) -> tuple[int, ...]:
    """A version's leading release numbers: '2.14.0.dev0+f031cf8' -> (2, 14, 0); '' -> ()."""
    out: list[int] = []
    for piece in (version or "").split("+", 1)[0].split("."):
        digits = ""
        for c in piece:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(out)


DEV = "Megatron-LM dev d48bd6be0a85"
# The NGC PyTorch release dev's CI image builds on (docker/.ngc_version.dev:1, .gitlab/stages/01.build.yml:65):
# Python 3.12 (docker/Dockerfile.ci.dev:74 installs into python3.12 site-packages) and CUDA 13 (the cu13 NVSHMEM
# and TE core wheels below). Its bundled torch, NCCL and cuDNN versions are NVIDIA's release notes' (PyTorch
# Release 26.04), not confirmed here: preflight prints what it finds and checks only their presence.
BASE_IMAGE = "nvcr.io/nvidia/pytorch:26.04-py3"
BASE_SOURCE = f"{DEV} docker/.ngc_version.dev:1"
MEGATRON_DIR = "/opt/megatron-lm"  # conf/workload/megatron.yaml runs /opt/megatron-lm/pretrain_hybrid.py
ARCHS = "9.0 10.0 12.0"  # Hopper, Blackwell, Blackwell (consumer): dev's DeepEP build (Dockerfile.ci.dev:83)

# In install order: Megatron-LM before DeepEP, whose build applies the patch dev's checkout carries.
COMPONENTS: tuple[Component, ...] = (
    Component(
        "python",
        "Python",
        BASE,
        module="",
        source=BASE_SOURCE,
        note="3.12 in the base image; this project's job code needs >= 3.11 (pyproject.toml requires-python)",
    ),
    Component("torch", "torch + CUDA", BASE, module="torch", dists=("torch",), source=BASE_SOURCE),
    Component("nccl", "NCCL", BASE, source=BASE_SOURCE, note="torch.cuda.nccl.version() of the base image's torch"),
    Component(
        "megatron",
        "Megatron-LM",
        GIT,
        git="https://github.com/NVIDIA/Megatron-LM.git",
        rev=TESTED_COMMIT,
        branch="dev",
        dest=MEGATRON_DIR,
        pip_install=False,
        source="orchestrator/core/megatron.py TESTED_COMMIT",
        note="a git checkout with its .git: preflight reads the commit from it and fails on an archive without",
    ),
    Component(
        "transformer_engine",
        "Transformer Engine",
        GIT,
        version="2.14.0",
        module="transformer_engine",
        dists=("transformer_engine", "transformer-engine", "transformer_engine_torch"),
        git="https://github.com/NVIDIA/TransformerEngine.git",
        rev="f031cf87bd054c7558b887df7bed93975456667f",
        env=("NVTE_FRAMEWORK=pytorch", "NVTE_CUDA_ARCHS=80;90;100"),  # dev's arches (Dockerfile.ci.dev:46)
        source=f"{DEV} pyproject.toml:203-204,227 (2.14.0+f031cf87); uv.lock:7899-7901",
        note=">= 2.13: --moe-router-fusion with sqrtsoftplus scores (moe/moe_utils.py:742-745)",
    ),
    Component(
        "cudnn_frontend",
        "cuDNN frontend DSA kernels",
        GIT,
        version="1.25.0",
        module="cudnn",
        dists=("nvidia-cudnn-frontend", "cudnn"),
        attr="DSA",  # dsa_cudnn_kernels.py:960 does `from cudnn import DSA`
        git="https://github.com/NVIDIA/cudnn-frontend.git",
        rev="0a14b7181d129d30e7bad34b8c3ed0a0c995e23d",
        extras="[cutedsl]",
        source=f"{DEV} pyproject.toml:226; uv.lock:4193-4195 (1.25.0)",
        note="--dsa-kernel-backend cudnn: the sparse CSA/HCA kernels",
    ),
    Component(
        "flash_mla",
        "FlashMLA (nv_dev)",
        GIT,
        version="1.0.0",
        module="flash_mla",
        dists=("flash_mla", "flash-mla"),
        git="https://github.com/deepseek-ai/FlashMLA.git",
        rev="b7643bd54521f563b839b98289b5cd048c062ba2",
        branch="nv_dev",
        source=f"{DEV} pyproject.toml:198-199,224 (rev nv_dev, 1.0.0+b7643bd); uv.lock:1705-1707 (the commit); "
        "FlashMLA b7643bd setup.py:148",
        note="--dsa-kernel-backend cudnn uses FlashMLA's sparse kernels (the nv_dev branch, not PyPI)",
    ),
    Component(
        "fast_hadamard_transform",
        "fast_hadamard_transform (CSA ratio-4 layers)",
        GIT,
        version="1.0.4.post1",
        module="fast_hadamard_transform",
        dists=("fast_hadamard_transform", "fast-hadamard-transform"),
        attr="hadamard_transform",  # dsa.py:264-269 asserts it is installed
        git="https://github.com/Dao-AILab/fast-hadamard-transform.git",
        rev="f134af63deb2df17e1171a9ec1ea4a7d8604d5ca",
        env=("FAST_HADAMARD_TRANSFORM_FORCE_BUILD=TRUE",),  # its setup.py:40: build here, fetch no wheel
        source=f"{DEV} pyproject.toml:217-218,230; fast-hadamard-transform f134af6 __init__.py:1",
        note="built from git: the PyPI sdist is a stub that downloads the kernel at build time",
    ),
    Component(
        "deep_ep",
        "DeepEP / HybridEP (flex dispatcher)",
        GIT,
        version="1.2.1",
        module="deep_ep",
        dists=("deep_ep", "deep-ep"),
        attr="HybridEPBuffer",  # moe/fused_a2a.py:494; checked for the hybridep backend only
        git="https://github.com/deepseek-ai/DeepEP.git",
        rev="eb9cee7de5a24193bf09500668d3a619d3d3f3fb",
        branch="hybrid-ep",
        env=(f"TORCH_CUDA_ARCH_LIST={ARCHS}",),
        setup=(
            "pip install --no-cache-dir nvidia-nvshmem-cu13==3.4.5",
            # the link dev's CI makes (Dockerfile.ci.dev:74-76), found where pip put NVSHMEM
            "ln -sf libnvshmem_host.so.3 "
            "\"$(python -c 'import nvidia.nvshmem as n; print(n.__path__[0])')/lib/libnvshmem_host.so\"",
            f"patch -p1 < {MEGATRON_DIR}/docker/patches/deepep.patch",
        ),
        source=f"{DEV} docker/Dockerfile.ci.dev:69-84; DeepEP eb9cee7 setup.py:275 (version 1.2.1+<short commit>)",
        note="the hybrid-ep branch carries HybridEPBuffer (flex:hybridep); NVSHMEM 3.4.5 and dev's patch as dev's CI",
    ),
    Component(
        "emerging_optimizers",
        "Muon optimizer (emerging_optimizers)",
        GIT,
        version="0.3.0",
        module="emerging_optimizers",
        dists=("emerging_optimizers", "emerging-optimizers"),
        git="https://github.com/NVIDIA-NeMo/Emerging-Optimizers.git",
        rev="b309e2f01cda75dc96a6dc1a2355a7b3b64b5e16",
        source=f"{DEV} pyproject.toml:229 (v0.3.0); uv.lock:1566-1568 (the commit)",
        note="model.optimizer=muon (megatron/core/optimizer/emerging_optimizers.py imports it)",
    ),
    Component(
        "submitit",
        "submitit (the job's runner)",
        PIP,
        version="1.5.4",
        module="submitit",
        dists=("submitit",),
        source="this project's pyproject.toml (submitit>=1.5.4)",
        note="every task starts as `python -m submitit.core._submit` in the container",
    ),
)
BY_KEY = {c.key: c for c in COMPONENTS}


def component(key: str) -> Component:
    """The manifest's component `key` (a KeyError names a component nobody pinned)."""
    return BY_KEY[key]


def src_dir(c: Component) -> str:
    """Where the recipe checks a GIT component out."""
    return c.dest or f"/opt/src/{c.key}"


# ------------------------------------------------------------------------------------------- the recipe
RECIPE = "docker/Dockerfile"  # the committed rendering (scripts/image.py writes it; a test compares)
TORCH_STAMP = "/opt/stack/torch-version"  # the base image's torch, compared after every install
TORCH_VERSION = "python -c 'import torch; print(torch.__version__)'"


def _run(lines: list[str]) -> str:
    return "RUN " + " \\\n && ".join(lines) + "\n"


def _git_steps(c: Component) -> str:
    """A GIT component's WORKDIR and RUN: fetch exactly `rev` (its .git kept: DeepEP's version and preflight's
    commit row are read from it), the setup lines, the install, the base torch still in place, and the source
    folder removed unless it stays (`dest`)."""
    where = src_dir(c)
    steps = [
        "git init -q .",
        f"git fetch -q --depth 1 {c.git} {c.rev}",
        "git checkout -q FETCH_HEAD",
        "git submodule update -q --init --recursive --depth 1",
        *c.setup,
    ]
    if c.pip_install:
        env = "".join(f"{name}={shlex.quote(value)} " for name, value in (e.split("=", 1) for e in c.env))
        steps.append(f"{env}pip install --no-cache-dir --no-build-isolation '.{c.extras}'")
        steps.append(f'test "$({TORCH_VERSION})" = "$(cat {TORCH_STAMP})"')
    if not c.dest:
        steps.append(f"rm -rf {where}")
    # the install is the checkout of `rev`: hadolint's DL3013 (pin pip versions) reads '.[extra]' as a name
    ignore = "# hadolint ignore=DL3013\n" if c.extras else ""
    return f"WORKDIR {where}\n{ignore}" + _run(steps) + "WORKDIR /\n"


def _verify() -> str:
    """The last RUN: every pinned distribution reports its pinned release, read from its metadata (no import:
    the kernels need a GPU the build has not)."""
    pins = {c.dists[0]: ".".join(map(str, c.release)) for c in COMPONENTS if c.version and c.dists}
    body = (
        "import importlib.metadata as m, sys; "
        f"pins = {pins!r}; "
        "bad = [f'{d}: {m.version(d)} != {v}' for d, v in pins.items() "
        "if not (m.version(d) + '.').startswith(v + '.') and not m.version(d).startswith(v + '+')]; "
        "sys.exit('; '.join(bad))"
    )
    return f'RUN python -c "{body}"\n'


def dockerfile() -> str:
    """The container recipe: the base image, then each component in manifest order, then the version check."""
    out = [
        "# GENERATED from orchestrator/core/stack.py by `python scripts/image.py`: edit the manifest, not this file.\n",
        "# The stack preflight checks (orchestrator/job/preflight.py), pinned as Megatron-LM dev's own CI image is\n",
        "# (docker/Dockerfile.ci.dev at the tested commit). Build and import it: docs/cluster.md section 9.\n",
        f"FROM {BASE_IMAGE}\n",
        'SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n',
        "# NGC images constrain pip to their bundled versions; the pins below replace some (dev clears it too,\n",
        "# Dockerfile.ci.dev:6). The base torch is stamped here and every install must leave it in place.\n",
        'ENV PIP_CONSTRAINT=""\n',
        _run(
            [
                f"mkdir -p {os.path.dirname(TORCH_STAMP)}",
                f"python -c 'import torch; print(torch.__version__)' > {TORCH_STAMP}",
            ]
        ),
    ]
    for c in COMPONENTS:
        pin = c.version or (c.rev[:12] if c.rev else "the base image's")
        out.append(f"\n# {c.key}: {c.what} {pin} ({c.source})\n")
        if c.note:
            out.append(f"# {c.note}\n")
        if c.install == GIT:
            out.append(_git_steps(c))
        elif c.install == PIP:
            out.append(f"RUN pip install --no-cache-dir '{c.dists[0]}=={c.version}'\n")
    out.append("\n# Every pinned distribution at its pinned release (metadata only: no GPU at build time).\n")
    out.append(_verify())
    out.append(f"WORKDIR {MEGATRON_DIR}\n")
    return "".join(out)
