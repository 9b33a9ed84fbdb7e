"""Launch candidate attempts: Slurm job arrays via submitit, or local processes.

`make_launcher(cluster)` picks one; every launcher has submit / poll / cancel / result and re-attaches
to stored job ids after a restart (`attach`)."""

from orchestrator.launch.base import (
    JobState,
    Launcher,
    LaunchError,
    LaunchTask,
    Submitted,
)
from orchestrator.launch.local import LocalLauncher
from orchestrator.launch.select import launcher_for, make_launcher, slurm_available, wait_for_slurm
from orchestrator.launch.slurm import SlurmLauncher

__all__ = [
    "JobState",
    "LaunchError",
    "LaunchTask",
    "Launcher",
    "LocalLauncher",
    "SlurmLauncher",
    "Submitted",
    "launcher_for",
    "make_launcher",
    "slurm_available",
    "wait_for_slurm",
]
