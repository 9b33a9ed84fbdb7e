"""The local backend: each task a process on this host (submitit's LocalExecutor)."""

from orchestrator.launch.local.launcher import LocalLauncher

__all__ = ["LocalLauncher"]
