"""Launch candidate attempts: the launcher interface (base), what every backend is given (task) and the registry's
record (registry: `Backend`, `register`).

One folder per backend, as submitit has one per executor, each registering itself as it is imported: `slurm/`
(job arrays through submitit, sacct, pyxis containers, launch intents found by job name) and `local/` (processes
on this host); `auto` is the registry's face, which finds the folders and answers by kind (`make_launcher`,
`launcher_for`, the config check, provenance, preflight's rows). This face imports no backend, so a backend can
import the interface without a cycle."""

from orchestrator.launch.base import JobState, Launcher, LaunchError, LaunchTask, Submitted, Unrunnable

__all__ = ["JobState", "LaunchError", "LaunchTask", "Launcher", "Submitted", "Unrunnable"]
