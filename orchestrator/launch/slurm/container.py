"""Containers on Slurm: pyxis `--container-*` flags on `srun`, never on `sbatch`.

Why on srun: with `#SBATCH --container-image` pyxis runs the whole batch script inside the container, and
`srun` cannot be used from there (pyxis FAQ); submitit's batch script is one `srun` line that starts
`<python> -u -m submitit.core._submit` on every task. So the image, mounts and working directory go into
submitit's `srun_args`, and `<python>` is the container's interpreter (`cluster.slurm.python`, submitit's
executor `python=`), not the login node's `sys.executable`. The orchestrator itself runs outside.

Inside the container the task imports this project (the pickled job function) and writes its job folder,
so both are mounted at their own paths and the project goes first on PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from pathlib import Path
from typing import Any

from orchestrator.core.errors import UserError
from orchestrator.core.schema import ClusterConfig
from orchestrator.launch.registry import Answer, Row

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
# Container options of pyxis's srun plugin (sbatch has the same names, with the batch-script semantics above).
PYXIS_OPTIONS = ("container-image", "container-mounts", "container-workdir", "container-name")


def check(cluster: ClusterConfig) -> None:
    """Refuse container settings that cannot work, naming the setting that does."""
    slurm = cluster.slurm
    misplaced = sorted(k for k in slurm.sbatch_extra if str(k).lstrip("-") in PYXIS_OPTIONS)
    if misplaced:
        raise UserError(
            f"cluster.slurm.sbatch_extra has {', '.join(misplaced)}: pyxis would run the whole batch script "
            "inside the container, where srun cannot start the tasks; use cluster.slurm.container.image / "
            "mounts / workdir (put on srun) and cluster.slurm.python instead"
        )
    image = slurm.container.image
    if image and not slurm.python:
        raise UserError(
            f"cluster.slurm.container.image={image} is set but cluster.slurm.python is not: set it to the Python "
            "inside the image (e.g. cluster.slurm.python=/usr/bin/python); without it submitit starts the login "
            "node's interpreter inside the container"
        )
    if not image and (slurm.container.mounts or slurm.container.workdir):
        raise UserError(
            "cluster.slurm.container.mounts / workdir are set without cluster.slurm.container.image: set the "
            "image too, or drop them"
        )


_PINNED = re.compile(r"@(sha256:[0-9a-f]{64})$")


def image_digest(image: str | None, *, hash_file: bool = True) -> str | None:
    """The image's content digest: the `@sha256:...` a registry reference pins, else (hash_file) the sha256 of
    a local squashfs file; None for an unpinned registry tag (which may change under the same name)."""
    if not image:
        return None
    pinned = _PINNED.search(image)
    if pinned:
        return pinned.group(1)
    path = Path(os.path.expanduser(image))
    if hash_file and path.is_file():
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        return f"sha256:{h.hexdigest()}"
    return None


def provenance(cluster: ClusterConfig) -> dict[str, Any]:
    """What a new sweep records of its container: the image and the digest its name pins ({} without an image; a
    squashfs file is hashed by preflight, `settings`, not at every sweep's start)."""
    image = cluster.slurm.container.image
    return {"container": {"image": image, "digest": image_digest(image, hash_file=False)}} if image else {}


def settings(cluster: ClusterConfig) -> Answer:
    """Preflight's row of the image and what the sweep records of it (nothing without a container). An image
    without a digest (a registry tag, which can change under its name) is a warning naming the fix."""
    image = cluster.slurm.container.image
    if not image:
        return Answer()
    digest = image_digest(image)
    if digest:
        row = Row("container image", "pass", f"{image} ({digest})")
    else:
        row = Row(
            "container image",
            "warn",
            f"{image}: no digest, the tag may name another image tomorrow",
            "pin it: cluster.slurm.container.image=<registry>/<image>@sha256:<digest>, or a squashfs file",
        )
    return Answer((row,), recorded={"container": {"image": image, "digest": digest}})


def mounts(cluster: ClusterConfig) -> list[str]:
    """The configured mounts, then the project checkout and cluster.folder at their own paths."""
    own = [str(PROJECT_ROOT), os.path.abspath(os.path.expanduser(cluster.folder))]
    out = list(cluster.slurm.container.mounts)
    taken = {m.split(":")[0] for m in out}
    out += [f"{p}:{p}" for p in dict.fromkeys(own) if p not in taken]
    return out


def srun_flags(cluster: ClusterConfig) -> list[str]:
    """pyxis flags for submitit's `srun_args` ([] without an image)."""
    image = cluster.slurm.container.image
    if not image:
        return []
    flags = [f"--container-image={image}", f"--container-mounts={','.join(mounts(cluster))}"]
    if cluster.slurm.container.workdir:
        flags.append(f"--container-workdir={cluster.slurm.container.workdir}")
    return flags


def setup_lines(cluster: ClusterConfig) -> list[str]:
    """Batch-script lines that let the container's Python import this project (pyxis passes the env on)."""
    if not cluster.slurm.container.image:
        return []
    return [f"export PYTHONPATH={shlex.quote(str(PROJECT_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}"]


def python(cluster: ClusterConfig) -> str | None:
    """submitit's executor `python=` (a shell command, e.g. `/usr/bin/python`): None = this process's own."""
    return cluster.slurm.python or None
