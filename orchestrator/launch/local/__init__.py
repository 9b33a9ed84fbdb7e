"""The local backend: each task a process on this host (submitit's LocalExecutor); registered as kind `local`,
auto's choice when no backend before it answers (it is always usable, so never probed nor waited for)."""

from collections.abc import Mapping

from orchestrator.core.schema import ClusterConfig, StageConfig
from orchestrator.launch.local.launcher import LocalLauncher
from orchestrator.launch.registry import Answer, Backend, Row, register


def limits(cluster: ClusterConfig, stage: StageConfig, asked: Mapping[str, int]) -> Answer:
    """No scheduler to ask: preflight's row says the cluster's limits were not checked, as a warning."""
    return Answer((Row("Slurm limits", "warn", "cluster=local: not checked", "run with cluster=slurm"),))


BACKEND = register(
    Backend(kind=LocalLauncher.kind, name="the local executor", launcher=LocalLauncher, auto_order=1, limits=limits)
)

__all__ = ["BACKEND", "LocalLauncher"]
