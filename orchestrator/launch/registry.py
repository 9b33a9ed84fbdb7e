"""The launcher registry: each backend folder under launch/ registers one `Backend` as it is imported.

Why a registry (as submitit keeps one folder per executor behind its plugins): what the layers above ask of a
backend (the config check of its settings group, what a sweep records about it, whether it answers here, how
a bound sweep waits for it, what its cluster can run) is asked by kind, so config.py, preflight.py and the
sweep import no backend, and a new backend is one folder under launch/ plus its config group. Callers go
through `orchestrator.launch.auto`, which imports every backend folder before it answers; this module holds
only the record and the table, so a backend can register without importing `auto`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.core.schema import ClusterConfig, StageConfig
from orchestrator.launch.base import Launcher

AUTO = "auto"  # the cluster.kind that picks a backend (launch/auto); no backend may take it

Probe = Callable[[], tuple[bool, str]]  # (answers, why) for this host
Event = Callable[[str], None]  # one line said while waiting
Status = Literal["pass", "warn", "fail"]  # a preflight row's verdict (orchestrator.job.preflight.CheckStatus)


@dataclass(frozen=True)
class Row:
    """One row of preflight's table that a backend answers from this host (preflight makes it a Check)."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Answer:
    """What a backend answers preflight: its rows, the candidates its cluster can never run (key -> why), and
    what the sweep records from them (provenance part -> value, e.g. the container image and its digest)."""

    rows: tuple[Row, ...] = ()
    rejected: Mapping[str, str] = field(default_factory=dict)
    recorded: Mapping[str, Any] = field(default_factory=dict)


def _no_check(cluster: ClusterConfig) -> None:
    return None


def _nothing(cluster: ClusterConfig) -> dict[str, Any]:
    return {}


def _no_settings(cluster: ClusterConfig) -> Answer:
    return Answer()


def _no_limits(cluster: ClusterConfig, stage: StageConfig, limits: Mapping[str, int]) -> Answer:
    return Answer()


def _no_refusal(cluster: ClusterConfig, stage: StageConfig) -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    """One launcher backend, as its folder registers it.

    Its settings group (`cluster.<kind>`) is checked and recorded on every config (`check`, `provenance`,
    `settings`), whatever cluster.kind says: `auto` may resolve to any backend, and a stored sweep keeps its
    settings. Its cluster (`limits`, `refusal`) is asked only when cluster.kind names it (for `auto`, of the
    backend auto tries first)."""

    kind: str  # cluster.kind, the kind a sweep is bound to (provenance.launcher) and a job's records name
    name: str  # in words, for one-line messages: "Slurm", "the local executor"
    launcher: Callable[[ClusterConfig], Launcher]
    # auto tries backends by this order, lowest first, and picks the first whose probe answers; None: only
    # picked by name (cluster.kind=<kind>)
    auto_order: int | None = None
    probe: Probe | None = None  # does it answer on this host? None: always usable, never asked
    # a sweep bound to it waits until it answers (cluster, event, probe) -> why; None: nothing to wait for
    wait: Callable[[ClusterConfig, Event, Probe], str] | None = None
    check: Callable[[ClusterConfig], None] = _no_check  # config.compose: raise UserError for unusable settings
    provenance: Callable[[ClusterConfig], dict[str, Any]] = _nothing  # a new sweep's provenance parts
    settings: Callable[[ClusterConfig], Answer] = _no_settings  # preflight's rows about its settings
    # preflight's rows about its cluster (partition, account, QoS) for a stage and each candidate's time limit
    limits: Callable[[ClusterConfig, StageConfig, Mapping[str, int]], Answer] = _no_limits
    refusal: Callable[[ClusterConfig, StageConfig], str | None] = _no_refusal  # the stage can never run there


BACKENDS: dict[str, Backend] = {}  # kind -> Backend; read through orchestrator.launch.auto, which fills it


def register(backend: Backend) -> Backend:
    """Add `backend` to the table (its folder's __init__ does, on import); a kind is registered once."""
    if backend.kind == AUTO or not backend.kind:
        raise ValueError(f"a backend may not be called {backend.kind!r}: cluster.kind={AUTO} picks one")
    taken = BACKENDS.get(backend.kind)
    if taken is not None and taken is not backend:
        raise ValueError(f"launcher kind {backend.kind!r} is registered twice ({taken.name}, {backend.name})")
    BACKENDS[backend.kind] = backend
    return backend
