"""The Slurm backend: job arrays through submitit, sacct polling, pyxis containers, launch intents; registered
as kind `slurm`, the one auto tries first (it answers when `sbatch --version` and `sinfo` do)."""

from orchestrator.launch.registry import Backend, register
from orchestrator.launch.slurm import container, limits, reach
from orchestrator.launch.slurm.launcher import SlurmLauncher
from orchestrator.launch.slurm.reach import slurm_available, wait_for_slurm

BACKEND = register(
    Backend(
        kind=SlurmLauncher.kind,
        name="Slurm",
        launcher=SlurmLauncher,
        auto_order=0,
        probe=reach.slurm_available,
        wait=reach.wait_for_slurm,
        check=container.check,
        provenance=container.provenance,
        settings=container.settings,
        limits=limits.rows,
        refusal=limits.refusal,
    )
)

__all__ = ["BACKEND", "SlurmLauncher", "slurm_available", "wait_for_slurm"]
