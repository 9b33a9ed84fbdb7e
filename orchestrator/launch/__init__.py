"""Launch candidate attempts: the launcher interface (base) and what every backend is given (task).

One folder per backend, as submitit has one per executor: `slurm/` (job arrays through submitit, sacct,
pyxis containers, launch intents found by job name) and `local/` (processes on this host); `auto`
is the registry that picks one (`make_launcher`, `launcher_for`). This face imports no backend, so a
backend can import the interface without a cycle."""

from orchestrator.launch.base import JobState, Launcher, LaunchError, LaunchTask, Submitted, Unrunnable

__all__ = ["JobState", "LaunchError", "LaunchTask", "Launcher", "Submitted", "Unrunnable"]
