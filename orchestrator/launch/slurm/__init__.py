"""The Slurm backend: job arrays through submitit, sacct polling, pyxis containers, launch intents."""

from orchestrator.launch.slurm.launcher import SlurmLauncher

__all__ = ["SlurmLauncher"]
