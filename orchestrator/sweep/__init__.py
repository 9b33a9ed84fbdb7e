"""`sweep`, `resume`: open the ledger, create or find the sweep, pick a cluster, drive the loop.

Modules: loop (the Driver), view (live table / plain lines), setup (promotion source, preflight gate); the past
is read through orchestrator/history (observations, budget).
"""

from __future__ import annotations

import copy
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from orchestrator.config import root_from_yaml
from orchestrator.core import bounds
from orchestrator.core.errors import DiskFull, Interrupted, UserError
from orchestrator.core.paths import JobPaths, check_name, disk_full
from orchestrator.core.schema import ClusterConfig, RootConfig
from orchestrator.core.states import EventKind
from orchestrator.launch import Unrunnable
from orchestrator.ledger.errors import LedgerError, LedgerStopped
from orchestrator.ledger.ledger import Ledger, SweepRow
from orchestrator.runspec import check_workload
from orchestrator.sweep.loop import Driver, Options, Outcome
from orchestrator.sweep.preview import same_stage
from orchestrator.sweep.price import SweepPrice
from orchestrator.sweep.setup import default_name, preflight_gate, provenance
from orchestrator.sweep.view import View

__all__ = [
    "Driver",
    "Options",
    "Outcome",
    "bound_launcher",
    "carry_on",
    "pick_launcher",
    "resume_sweep",
    "run_sweep",
]


def plain_resume(name: str) -> str:
    """The command that continues sweep `name` (a command adds the ledger overrides it was given)."""
    return f"`python -m orchestrator resume {name}`"


def pick_launcher(cfg: RootConfig, view: View):
    """cluster=auto picks Slurm when sbatch answers, else the local executor; says which and why.
    Jobs get the workload's resources where the cluster sets none (RootConfig.job_cluster)."""
    from orchestrator.launch.auto import make_launcher

    launcher, reason = make_launcher(cfg.job_cluster())
    view.event(f"cluster: {launcher.kind} ({reason})")
    return launcher


def bound_launcher(ledger: Ledger, cfg: RootConfig, name: str, view: View, *, launcher=None):
    """The launcher the sweep is bound to. Until a job launched, cluster.kind picks it (auto resolves here);
    the driver stores the kind as it launches the first job (`Driver._launch`, after the partition check), so a
    launcher that refuses the sweep's jobs binds nothing. Once bound, `sweep`, `resume` and `cancel` get that
    kind again whatever Slurm answers right now, waiting for it with a bounded backoff (launch.launcher_for). A
    cluster.kind naming the other launcher is refused: the sweep's job ids mean nothing there."""
    from orchestrator.launch.auto import launcher_for

    bound = ledger.get_sweep(name).provenance.get("launcher") or _legacy_kind(ledger, name)  # type: ignore[union-attr]
    if bound is None:
        return launcher or pick_launcher(cfg, view)
    if cfg.cluster.kind not in ("auto", bound) or (launcher is not None and launcher.kind != bound):
        asked = launcher.kind if launcher is not None else cfg.cluster.kind
        raise UserError(
            f"sweep '{name}' runs its jobs on {bound}, not {asked}: its job ids mean nothing there; "
            f"drop the cluster override (or use cluster={bound})"
        )
    ledger.bind_launcher(name, bound)
    if launcher is not None:
        return launcher
    launcher, reason = launcher_for(bound, cfg.job_cluster(), view.event)
    view.event(f"cluster: {launcher.kind} ({reason})")
    return launcher


def _legacy_kind(ledger: Ledger, name: str) -> str | None:
    """A sweep from before the binding was stored: the kind its last driver named, if it launched anything."""
    if not any(ledger.attempts(c.id) for c in ledger.candidates(name)):
        return None
    said = [e.message.rsplit(" ", 1)[-1] for e in ledger.events(name, kind=EventKind.DRIVER)]
    return said[-1] if said else None


def stage_task(cfg: RootConfig):
    """A task of the stage's shape (N GPUs, GPUs per node, the workload's resources): what every measurement of
    the sweep asks of the cluster, compared with the partition before the sweep exists (`check_fits`)."""
    from orchestrator.launch import LaunchTask

    stage = cfg.required_stage()
    return LaunchTask(
        fn=print,
        args=(),
        n_gpus=stage.gpus,
        gpus_per_node=stage.gpus_per_node,
        name=f"stage {stage.name}'s",
        folder=".",
        time_min=0,
    )


def run_sweep(
    cfg: RootConfig,
    config_yaml: str,
    *,
    options: Options | None = None,
    view: View | None = None,
    launcher=None,
    preface: Sequence[str] = (),
    resume: Callable[[str], str] = plain_resume,
    price: Callable[[], SweepPrice | None] | None = None,
    runnable: Callable[[], str] = lambda: "",
) -> Outcome:
    """Create the sweep (or continue the one with this name) and drive it to its end. `preface`: the lines said
    first, once the ledger is open (the price before the spend, orchestrator/sweep/preview.py), and for a new
    sweep what another sweep of its stage already spent (`preview.same_stage`). `resume(name)`: the command that
    continues a sweep, with the ledger it was given (after a stop from outside: `carry_on`). `price()`: the whole
    sweep's simulated price (sweep/price.py), asked only for a new sweep the cluster can run (tens of CPU-seconds:
    a refused or continued sweep does not wait for it), said after the preface and kept in the sweep's provenance
    for `status` and the report. `runnable()`: the command that runs where the cluster refuses the stage's size,
    asked only then (orchestrator/config `runnable_fix`, with the command's overrides)."""
    if cfg.stage is None:
        raise UserError("no stage given: add +stage=NAME (e.g. +stage=1k)")
    view = view or View()
    name = default_name(cfg)
    check_workload(cfg)
    with Ledger.from_config(cfg.ledger, create=True) as ledger, view:
        for line in preface:
            view.event(line)
        whole = None
        if ledger.get_sweep(name) is None:  # a new sweep: one the cluster can never run is refused unwritten
            for line in same_stage(ledger, cfg, name, resume):
                view.event(line)
            launcher = launcher or pick_launcher(cfg, view)
            try:
                launcher.check_fits([stage_task(cfg)])
            except Unrunnable as exc:
                fix = runnable()
                raise Unrunnable(f"{exc}; this runs there: {fix}" if fix else str(exc)) from None
            whole = price() if price is not None else None
            if whole is not None:
                view.event(whole.line())
        sweep = ledger.create_or_get_sweep(
            name,
            stage=cfg.stage.name,
            config_yaml=config_yaml,
            model=cfg.model.name,
            hardware=cfg.hardware.name,
            workload=cfg.workload.name,
            provenance={**provenance(cfg), **({"price": whole.to_dict()} if whole is not None else {})},
        )
        view.event(
            f"sweep {name} (stage {cfg.stage.name}, N={cfg.stage.gpus}, model {cfg.model.name}, "
            f"workload {cfg.workload.name}{' SIMULATED' if cfg.workload.simulated else ''}) "
            f"ledger {ledger.url}"
        )
        with carry_on(resume(name)):
            preflight_gate(ledger, cfg, name, skip=bool(options and options.skip_preflight), view=view)
            launcher = bound_launcher(ledger, cfg, name, view, launcher=launcher)
            return Driver(ledger, cfg, sweep, launcher, view, options).run()


@contextmanager
def carry_on(again: str) -> Iterator[None]:
    """A sweep stopped from outside says how it goes on: a signal (SIGINT, SIGTERM), a ledger locked past its
    wait or out of reach (LedgerStopped), a full disk anywhere (an OSError from whichever write met it first:
    a job folder, a result, a cut's mark). Its jobs keep running, and `again` (`python -m orchestrator resume
    NAME` with the ledger it was given) continues it; the CLI prints the one line. Only once the sweep exists:
    before that, running the command again is what to do."""
    try:
        yield
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        raise Interrupted(signum, f"the sweep's jobs keep running; {again} continues it") from None
    except OSError as exc:
        full = disk_full(exc)
        if full is None:
            raise
        full.again = again
        raise full from None
    except (DiskFull, LedgerStopped) as exc:
        exc.again = again
        raise


def stored_sweep(ledger: Ledger, name: str, current: RootConfig | None = None) -> SweepRow:
    """The sweep named `name`; a UserError naming the known ones when the ledger has none by that name (and,
    given the `current` config, how to rebuild its rows from its job folders when its ledger was lost)."""
    sweep = ledger.get_sweep(name)
    if sweep is None:
        known = [s.name for s in ledger.list_sweeps()][-10:]
        hint = f"; known: {', '.join(known)}" if known else ""
        if current is not None:
            hint += f"; {ingest_hint(name, current, ledger)}"
        raise UserError(f"no sweep named '{name}' in {ledger.url}{hint}")
    return sweep


def open_stored(current: RootConfig, name: str) -> Ledger:
    """The ledger of an existing sweep (`resume`, `cancel`); a SQLite ledger that is not there says how to
    rebuild the sweep's rows from its job folders (`ingest_hint`) besides where it looked."""
    try:
        return Ledger.from_config(current.ledger)
    except LedgerError as exc:
        path = _sqlite_path(current.ledger.url)
        if path is None or path.exists():
            raise
        raise UserError(f"{exc}; {ingest_hint(name, current)}") from None


def ingest_hint(name: str, current: RootConfig, ledger: Ledger | None = None) -> str:
    """`ledger ingest` of the sweep's job folders, named where they are: `<cluster.folder>/<name>` holding a
    job folder, cluster.folder being the command line's (or the default), that folder read beside a SQLite
    ledger when it is relative, or another sweep's of this ledger; where none holds one, the hint says so
    rather than name a folder that is not the sweep's."""
    given = Path(current.cluster.folder).expanduser()
    roots = [given]
    path = _sqlite_path(current.ledger.url)
    if path is not None and not given.is_absolute():
        roots.append(path.expanduser().resolve().parent / given)
    for other in ledger.list_sweeps() if ledger is not None else []:
        try:
            roots.append(Path(root_from_yaml(other.config_yaml).cluster.folder).expanduser())
        except Exception:  # noqa: BLE001 - a snapshot that does not load names no folder
            continue
    for root in dict.fromkeys(r.resolve() for r in roots):
        folder = root / name
        if folder.is_dir() and next(folder.glob(f"*/*/{JobPaths.SPEC}"), None) is not None:
            return f"if its ledger was lost: python -m orchestrator ledger ingest {folder} (same ledger.url)"
    return (
        f"if its ledger was lost: python -m orchestrator ledger ingest <the cluster.folder it ran with>/{name} "
        f"(same ledger.url; no job folder of it in {given.resolve() / name})"
    )


def _sqlite_path(url: str) -> Path | None:
    """The file a SQLite ledger URL opens (None: another engine, or none), as the ledger resolves it
    (orchestrator/ledger/engine.py `sqlite_path`: a URI-mode URL's file, not its literal database string)."""
    from orchestrator.ledger.engine import sqlite_path

    try:
        return sqlite_path(make_url(url))
    except Exception:  # noqa: BLE001 - a URL the ledger refuses itself, with its own message
        return None


def stored_config(ledger: Ledger, name: str, current: RootConfig, overrides: Sequence[str] = ()) -> RootConfig:
    """The config a sweep was created with; the ledger comes from the caller, and so does the cluster as its
    `overrides` (the command line) change it (`resumed_cluster`)."""
    cfg = root_from_yaml(stored_sweep(ledger, name, current).config_yaml)
    cfg.ledger = current.ledger
    cfg.cluster = resumed_cluster(cfg.cluster, current.cluster, overrides)
    return cfg


def resumed_cluster(stored: ClusterConfig, current: ClusterConfig, overrides: Sequence[str]) -> ClusterConfig:
    """The cluster group a stored sweep goes on with. `cluster=NAME` picks that group as composed now; each
    `cluster.KEY=VALUE` changes that key alone of the group the sweep was stored with, so its kind stays the
    stored one unless `cluster.kind` is given (today's default, auto, would pick Slurm for a sweep whose jobs
    ran locally, when sinfo answers); no cluster override: the stored group."""
    keys = [o.lstrip("+~").split("=", 1)[0] for o in overrides if "=" in o or o.startswith("~")]
    if "cluster" in keys:
        return current
    out = copy.deepcopy(stored)
    for key in keys:
        if key.startswith("cluster."):
            _copy_key(current, out, key.split(".")[1:])
    return out


def _copy_key(src: Any, dst: Any, path: list[str]) -> None:
    """dst's value at `path` (attributes of the config dataclasses, keys of a mapping such as cluster.env) set
    to src's (removed from a mapping where src has none: a `~` override)."""
    for part in path[:-1]:
        src, dst = _part(src, part), _part(dst, part)
    leaf = path[-1]
    if isinstance(dst, dict):
        if isinstance(src, dict) and leaf in src:
            dst[leaf] = copy.deepcopy(src[leaf])
        else:
            dst.pop(leaf, None)
    elif hasattr(src, leaf):
        setattr(dst, leaf, copy.deepcopy(getattr(src, leaf)))


def _part(obj: Any, part: str) -> Any:
    return obj[part] if isinstance(obj, dict) else getattr(obj, part)


def resume_sweep(
    name: str,
    current: RootConfig,
    *,
    overrides: Sequence[str] = (),
    options: Options | None = None,
    view: View | None = None,
    launcher=None,
    resume: Callable[[str], str] = plain_resume,
    runnable: Callable[[], str] = lambda: "",
) -> Outcome:
    """Take the lease and continue a sweep from its stored config and ledger rows (`overrides`: the command
    line's, which change the stored cluster group: `resumed_cluster`)."""
    view = view or View()
    check_name(name, source="the sweep name")
    with open_stored(current, name) as ledger:
        cfg = stored_config(ledger, name, current, overrides)
        sweep = stored_sweep(ledger, name)
    cfg.sweep.name = name
    out_of_range = bounds.violation(cfg)  # a sweep stored before its field had a range
    if out_of_range is not None:
        raise UserError(f"sweep {name} was stored with {out_of_range.message()}: start a new sweep with a fixed value")
    return run_sweep(cfg, sweep.config_yaml, options=options, view=view, launcher=launcher, resume=resume)
