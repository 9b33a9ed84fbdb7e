"""Pick the launcher: Slurm when its client answers, else the local executor.

Why both `sbatch --version` and `sinfo`: the client can be installed with no reachable controller
(a laptop, a login node during maintenance); only a controller that answers can run jobs.
"""

from __future__ import annotations

import shutil
import subprocess

from orchestrator.errors import UserError
from orchestrator.launch.base import Launcher
from orchestrator.launch.local import LocalLauncher
from orchestrator.launch.slurm import SlurmLauncher
from orchestrator.schema import ClusterConfig


def slurm_available(timeout_s: float = 20.0) -> tuple[bool, str]:
    """(answers, why) for this machine's Slurm client and controller."""
    if shutil.which("sbatch") is None:
        return False, "no sbatch on PATH"
    try:
        ver = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=timeout_s)
        if ver.returncode != 0:
            return False, f"sbatch --version failed: {ver.stderr.strip()[:120]}"
        info = subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"Slurm does not answer ({exc})"
    if info.returncode != 0:
        last = (info.stderr.strip().splitlines() or ["?"])[-1]
        return False, f"sinfo failed: {last[:120]}"
    nodes = sum(int(x) for x in info.stdout.split() if x.isdigit())
    return True, f"{ver.stdout.strip()} answers, sinfo lists {nodes} node(s)"


def make_launcher(cluster: ClusterConfig) -> tuple[Launcher, str]:
    """The launcher for `cluster.kind` (auto | slurm | local) and a one-line reason for the choice."""
    if cluster.kind == "local":
        return LocalLauncher(cluster), "cluster.kind=local"
    if cluster.kind not in ("auto", "slurm"):
        raise UserError(f"cluster.kind={cluster.kind!r} is unknown: use auto, slurm or local")
    ok, why = slurm_available()
    if ok:
        return SlurmLauncher(cluster), why
    if cluster.kind == "slurm":
        raise UserError(f"cluster.kind=slurm but Slurm is not usable here ({why}); use cluster=local or cluster=auto")
    return LocalLauncher(cluster), f"{why}; using the local executor"
