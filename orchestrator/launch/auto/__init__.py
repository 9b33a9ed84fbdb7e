"""The registry's face (as submitit's AutoExecutor): every backend folder under launch/ loaded, a backend by its
kind, and cluster.kind=auto's choice.

Why the folders are found, not listed: a backend registers itself as its folder is imported
(orchestrator/launch/registry.py), so a new one is a folder under launch/ and nothing here or above names it.
Why `launcher_for` waits instead of falling back: a sweep is bound to the launcher its jobs run on
(`cluster=auto` resolves once); a backend that does not answer for a moment (Slurm during a controller restart)
must not turn its running jobs into "lost" jobs of another whose half-written folders read as results.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from orchestrator import launch
from orchestrator.core.errors import UserError
from orchestrator.core.schema import ClusterConfig, StageConfig
from orchestrator.launch.base import Launcher
from orchestrator.launch.registry import AUTO, BACKENDS, Answer, Backend, Probe

_loaded: list[str] = []  # the backend folders imported (once per process)


def load() -> dict[str, Backend]:
    """kind -> Backend, after importing every package under orchestrator/launch/ but this one (each registers
    itself); a backend registered from elsewhere (a test's) is kept."""
    if not _loaded:
        for info in pkgutil.iter_modules(launch.__path__, f"{launch.__name__}."):
            if info.ispkg and info.name != __name__:
                importlib.import_module(info.name)
                _loaded.append(info.name)
    return BACKENDS


def backends() -> list[Backend]:
    """Every backend: those auto tries, in its order, then the others by kind."""
    return sorted(load().values(), key=lambda b: (b.auto_order is None, b.auto_order or 0, b.kind))


def kinds() -> tuple[str, ...]:
    """The kinds a sweep can be bound to (cluster.kind without `auto`)."""
    return tuple(b.kind for b in backends())


def _unknown(kind: str) -> UserError:
    names = [AUTO, *kinds()]
    return UserError(f"cluster.kind={kind!r} is unknown: use {', '.join(names[:-1])} or {names[-1]}")


def backend(kind: str) -> Backend:
    """The backend registered as `kind`; a UserError naming the kinds there are when none is."""
    found = load().get(kind)
    if found is None:
        raise _unknown(kind)
    return found


def for_kind(kind: str) -> Backend:
    """The backend whose cluster a config's kind asks about: the one it names; for auto, the first auto tries
    (what it picks wherever that one answers), so a check of auto's limits is one of that backend's."""
    if kind != AUTO:
        return backend(kind)
    tried = [b for b in backends() if b.auto_order is not None]
    if not tried:
        raise UserError("cluster.kind=auto: no backend is registered for auto to pick; name one with cluster.kind")
    return tried[0]


def check(cluster: ClusterConfig) -> None:
    """Every backend's check of its own settings group (a UserError naming the fix): auto may resolve to any."""
    for b in backends():
        b.check(cluster)


def provenance(cluster: ClusterConfig) -> dict[str, Any]:
    """What a new sweep records of every backend's settings (provenance parts, e.g. `container`)."""
    out: dict[str, Any] = {}
    for b in backends():
        out.update(b.provenance(cluster))
    return out


def settings(cluster: ClusterConfig) -> Answer:
    """Preflight's rows about every backend's settings, and what the sweep records from them."""
    answers = [b.settings(cluster) for b in backends()]
    recorded: dict[str, Any] = {}
    for a in answers:
        recorded.update(a.recorded)
    return Answer(rows=tuple(r for a in answers for r in a.rows), recorded=recorded)


def limits(cluster: ClusterConfig, stage: StageConfig, asked: dict[str, int]) -> Answer:
    """Preflight's rows about the cluster `cluster.kind` names (auto: `for_kind`) for the stage and each
    candidate's time limit, and the candidates it can never run."""
    return for_kind(cluster.kind).limits(cluster, stage, asked)


def refusal(cluster: ClusterConfig, stage: StageConfig) -> str | None:
    """One line when the stage's jobs can never run on the cluster `cluster.kind` names (auto: `for_kind`)."""
    return for_kind(cluster.kind).refusal(cluster, stage)


def _others(kind: str) -> str:
    names = [f"cluster={k}" for k in kinds() if k != kind] + [f"cluster={AUTO}"]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def make_launcher(cluster: ClusterConfig) -> tuple[Launcher, str]:
    """The launcher for `cluster.kind` and a one-line reason for the choice. A named backend with a probe must
    answer (else a UserError naming the other kinds); auto takes the first backend in its order that answers
    (one never probed always does), its reason the declined ones' whys and the chosen one's."""
    if cluster.kind != AUTO:
        named = backend(cluster.kind)
        if named.probe is None:
            return named.launcher(cluster), f"cluster.kind={named.kind}"
        ok, why = named.probe()
        if not ok:
            raise UserError(
                f"cluster.kind={named.kind} but {named.name} is not usable here ({why}); use {_others(named.kind)}"
            )
        return named.launcher(cluster), why
    declined: list[str] = []
    for b in backends():
        if b.auto_order is None:
            continue
        if b.probe is None:
            return b.launcher(cluster), "; ".join([*declined, f"using {b.name}"])
        ok, why = b.probe()
        if ok:
            return b.launcher(cluster), "; ".join([*declined, why])
        declined.append(why)
    raise UserError(f"cluster.kind=auto found no launcher that answers ({'; '.join(declined) or 'none registered'})")


def launcher_for(
    kind: str, cluster: ClusterConfig, event: Callable[[str], None], *, probe: Probe | None = None
) -> tuple[Launcher, str]:
    """The launcher of a sweep bound to `kind`, waiting (its backend's `wait`, with `probe` instead of its own
    when given) until it answers, never falling back to another."""
    bound = load().get(kind)
    if bound is None:
        raise UserError(f"the sweep is bound to launcher {kind!r}, which this version does not know: use a newer one")
    asked = probe or bound.probe
    if bound.wait is None or asked is None:
        return bound.launcher(cluster), "bound to the sweep"
    why = bound.wait(cluster, event, asked)
    return bound.launcher(cluster), f"bound to the sweep; {why}"
