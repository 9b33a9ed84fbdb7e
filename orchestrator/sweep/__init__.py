"""`sweep`, `resume`: open the ledger, create or find the sweep, pick a cluster, drive the loop.

Modules: loop (the Driver), observe (ledger -> observations, budget), view (live table / plain lines),
setup (names, stored config, promotion source).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from orchestrator.core import bounds
from orchestrator.core.errors import DiskFull, Interrupted, UserError
from orchestrator.core.paths import disk_full
from orchestrator.core.schema import RootConfig
from orchestrator.ledger.errors import LedgerStopped
from orchestrator.ledger.ledger import Ledger, SweepRow
from orchestrator.runspec import check_workload
from orchestrator.sweep.loop import Driver, Options, Outcome
from orchestrator.sweep.preview import same_stage
from orchestrator.sweep.setup import check_name, default_name, preflight_gate, provenance, root_from_yaml
from orchestrator.sweep.view import View

__all__ = [
    "Driver",
    "Options",
    "Outcome",
    "bound_launcher",
    "carry_on",
    "open_ledger",
    "pick_launcher",
    "resume_sweep",
    "run_sweep",
]


def plain_resume(name: str) -> str:
    """The command that continues sweep `name` (a command adds the ledger overrides it was given)."""
    return f"`python -m orchestrator resume {name}`"


def open_ledger(cfg: RootConfig, *, create: bool = False) -> Ledger:
    """The configured ledger. Only `sweep` creates one (`create`): status, resume and cancel of a typo'd
    URL say so instead of leaving an empty ledger behind."""
    led = cfg.ledger
    return Ledger.open(
        led.url, create=create, create_dir=led.create_dir, echo=led.echo, busy_timeout_ms=led.busy_timeout_ms
    )


def pick_launcher(cfg: RootConfig, view: View):
    """cluster=auto picks Slurm when sbatch answers, else the local executor; says which and why.
    Jobs get the workload's resources where the cluster sets none (RootConfig.job_cluster)."""
    from orchestrator.launch.auto import make_launcher

    launcher, reason = make_launcher(cfg.job_cluster())
    view.event(f"cluster: {launcher.kind} ({reason})")
    return launcher


def bound_launcher(ledger: Ledger, cfg: RootConfig, name: str, view: View, *, launcher=None):
    """The launcher the sweep is bound to. The first time (no jobs yet) cluster.kind picks it (auto resolves
    here, once) and the ledger stores the kind; later, `sweep`, `resume` and `cancel` get that kind again
    whatever Slurm answers right now, waiting for it with a bounded backoff (launch.launcher_for). A
    cluster.kind naming the other launcher is refused: the sweep's job ids mean nothing there."""
    from orchestrator.launch.auto import launcher_for

    bound = ledger.get_sweep(name).provenance.get("launcher") or _legacy_kind(ledger, name)  # type: ignore[union-attr]
    if bound is None:
        launcher = launcher or pick_launcher(cfg, view)
        ledger.bind_launcher(name, launcher.kind)
        return launcher
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
    said = [e.message.rsplit(" ", 1)[-1] for e in ledger.events(name, kind="driver")]
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
) -> Outcome:
    """Create the sweep (or continue the one with this name) and drive it to its end. `preface`: the lines said
    first, once the ledger is open (the price before the spend, orchestrator/sweep/preview.py), and for a new
    sweep what another sweep of its stage already spent (`preview.same_stage`). `resume(name)`: the command that
    continues a sweep, with the ledger it was given (after a stop from outside: `carry_on`)."""
    if cfg.stage is None:
        raise UserError("no stage given: add +stage=NAME (e.g. +stage=1k)")
    view = view or View()
    name = default_name(cfg)
    check_workload(cfg)
    with open_ledger(cfg, create=True) as ledger, view:
        for line in preface:
            view.event(line)
        if ledger.get_sweep(name) is None:  # a new sweep: one the cluster can never run is refused unwritten
            for line in same_stage(ledger, cfg, name, resume):
                view.event(line)
            launcher = launcher or pick_launcher(cfg, view)
            launcher.check_fits([stage_task(cfg)])
        sweep = ledger.create_or_get_sweep(
            name,
            stage=cfg.stage.name,
            config_yaml=config_yaml,
            model=cfg.model.name,
            hardware=cfg.hardware.name,
            workload=cfg.workload.name,
            provenance=provenance(cfg),
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


def stored_sweep(ledger: Ledger, name: str, folder: str = "") -> SweepRow:
    """The sweep named `name`; a UserError naming the known ones when the ledger has none by that name (and,
    with the job folders' root `folder`, how to rebuild its rows from them when its ledger was lost)."""
    sweep = ledger.get_sweep(name)
    if sweep is None:
        known = [s.name for s in ledger.list_sweeps()][-10:]
        hint = f"; known: {', '.join(known)}" if known else ""
        if folder:
            hint += f"; if its ledger was lost: python -m orchestrator ledger ingest {folder}/{name}"
        raise UserError(f"no sweep named '{name}' in {ledger.url}{hint}")
    return sweep


def stored_config(ledger: Ledger, name: str, current: RootConfig) -> RootConfig:
    """The config a sweep was created with; the ledger (and cluster, if given now) come from the caller."""
    cfg = root_from_yaml(stored_sweep(ledger, name, str(current.cluster.folder)).config_yaml)
    cfg.ledger = current.ledger
    return cfg


def resume_sweep(
    name: str,
    current: RootConfig,
    *,
    cluster_given: bool,
    options: Options | None = None,
    view: View | None = None,
    launcher=None,
    resume: Callable[[str], str] = plain_resume,
) -> Outcome:
    """Take the lease and continue a sweep from its stored config and ledger rows."""
    view = view or View()
    check_name(name, source="the sweep name")
    with open_ledger(current) as ledger:
        cfg = stored_config(ledger, name, current)
        sweep = stored_sweep(ledger, name)
    if cluster_given:
        cfg.cluster = current.cluster
    cfg.sweep.name = name
    out_of_range = bounds.violation(cfg)  # a sweep stored before its field had a range
    if out_of_range is not None:
        raise UserError(f"sweep {name} was stored with {out_of_range.message()}: start a new sweep with a fixed value")
    return run_sweep(cfg, sweep.config_yaml, options=options, view=view, launcher=launcher, resume=resume)
