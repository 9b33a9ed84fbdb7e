"""Sweep set-up: names, the stored config, the promotion source, the holder id, provenance."""

from __future__ import annotations

import contextlib
import platform
import socket
from importlib import metadata

from orchestrator.config import root_from_yaml
from orchestrator.core.errors import UserError
from orchestrator.core.paths import check_name
from orchestrator.core.schema import RootConfig
from orchestrator.core.states import EventKind
from orchestrator.ledger.leases import holder_alive
from orchestrator.ledger.ledger import Ledger, SweepRow

# A sweep name becomes a folder under cluster.folder and reports/, a Slurm job name (submitit expands `%j`/`%A`
# in paths) and a ledger key (200 characters): letters, digits, `.`, `_`, `-`, starting with a letter or digit.


def default_name(cfg: RootConfig) -> str:
    """`<stage>-<model>-<hardware>`, unless sweep.name is given; checked by `check_name`."""
    if cfg.sweep.name:
        return check_name(cfg.sweep.name)
    name = f"{cfg.required_stage().name}-{cfg.model.name}-{cfg.hardware.name}"
    return check_name(name, source="the default sweep name <stage>-<model>-<hardware>")


def holder_dead(holder: str) -> bool:
    """True when `holder` is a process of this host that no longer exists (orchestrator.ledger.leases.holder_alive)."""
    return holder_alive(holder) is False


def provenance(cfg: RootConfig) -> dict:
    """What the sweep runs with, as this host sees it: package versions, the workload, the cluster env, the
    Megatron commit it was tested against and what the launchers record of their settings (launch/auto
    `provenance`: with a container, its image and digest); preflight adds the node's checkout commit
    (`preflight_gate`)."""
    from orchestrator.core.megatron import TESTED_COMMIT
    from orchestrator.launch import auto

    versions = {}
    for pkg in ("dsv4-orchestrator", "submitit", "sqlalchemy", "hydra-core", "megatron-core", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    return {
        "versions": versions,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "workload": {
            "name": cfg.workload.name,
            "command": list(cfg.workload.command),
            "simulated": cfg.workload.simulated,
        },
        "env": dict(cfg.cluster.env),
        "megatron": {"tested_commit": TESTED_COMMIT},
        **auto.provenance(cfg.cluster),
    }


def recorded_source(ledger: Ledger, sweep: SweepRow) -> SweepRow | None:
    """The sweep this one recorded as its promotion source (its `promotes-from` event), if it is still in the
    ledger; None otherwise (nothing chosen, nothing to promote from, or the source deleted since)."""
    chosen = [(e.data or {}).get("sweep_id") for e in ledger.events(sweep.name, kind=EventKind.PROMOTES_FROM)]
    return next((s for s in ledger.list_sweeps() if chosen and s.id == chosen[0]), None)


def promotion_source(ledger: Ledger, cfg: RootConfig, sweep: SweepRow) -> tuple[SweepRow, RootConfig] | None:
    """The sweep this one promotes from: the most recent sweep of the stage it promotes from (same model), chosen
    once and recorded by id (a `promotes-from` event), so a resumed sweep reads the same source even after
    another sweep of that stage began; None if the stage promotes from none."""
    src_stage = cfg.required_stage().promotes_from
    if not src_stage:
        return None
    chosen = [(e.data or {}).get("sweep_id") for e in ledger.events(sweep.name, kind=EventKind.PROMOTES_FROM)]
    if chosen:
        src = recorded_source(ledger, sweep)
        if src is None:
            raise UserError(
                f"sweep {sweep.name} promotes from sweep id {chosen[0]}, which is no longer in the ledger "
                f"{ledger.url}: start a new sweep of stage {cfg.required_stage().name}"
            )
        return src, root_from_yaml(src.config_yaml)
    cands = [s for s in ledger.list_sweeps() if s.stage == src_stage and s.model == cfg.model.name]
    if not cands:
        raise UserError(
            f"stage {cfg.required_stage().name} promotes from stage {src_stage}, but the ledger {ledger.url} has no "
            f"{src_stage} sweep of model {cfg.model.name}: run `python -m orchestrator sweep +stage={src_stage}` first"
        )
    src = max(cands, key=lambda s: s.id)
    if not ledger.evidence.measured(sweep=src.name):
        raise UserError(
            f"sweep {src.name} (stage {src_stage}) has no measured candidate to promote; "
            f"resume it first: python -m orchestrator resume {src.name}"
        )
    ledger.log_event(sweep.name, EventKind.PROMOTES_FROM, f"promotes from sweep {src.name}", data={"sweep_id": src.id})
    return src, root_from_yaml(src.config_yaml)


def preflight_gate(ledger: Ledger, cfg: RootConfig, name: str, *, skip: bool, view) -> None:
    """A real workload's sweep runs preflight once, before round 0, and refuses to launch when it fails.

    Once: not when the sweep already has candidates or a passed (or skipped) preflight. The outcome, or the
    skipping, is a ledger event (EventKind.PREFLIGHT) whose `rejected` keys are never launched; the
    node's Megatron commit goes into the sweep's provenance. Whichever way, the passed preflight's evidence
    decides the stage's lifted rules (`lift_rules`), on resume too."""
    from orchestrator import preflight

    if cfg.workload.simulated:
        return
    passed = [e for e in ledger.events(name, kind=EventKind.PREFLIGHT) if (e.data or {}).get("ok")]
    if passed or ledger.candidates(name):
        lift_rules(cfg, (passed[-1].data or {}) if passed else {}, view)
        return
    if skip:
        ledger.log_event(
            name, EventKind.PREFLIGHT, "preflight skipped (--skip-preflight)", data={"ok": True, "skipped": True}
        )
        view.event("preflight skipped (--skip-preflight): recorded in the ledger")
        lift_rules(cfg, {}, view)
        return
    stage = cfg.stage.name if cfg.stage is not None else "the stage"
    view.event(f"preflight: a 1-node job checks the container, Megatron and {stage}'s candidates ...")
    outcome = preflight.run(cfg)
    failed = [c.name for c in outcome.checks if str(c.status) == "fail"]
    verdict = "passed" if outcome.ok else f"failed: {', '.join(failed)}"
    ledger.log_event(name, EventKind.PREFLIGHT, f"preflight {verdict}", data=outcome.to_dict())
    if outcome.megatron:
        ledger.add_provenance(name, "megatron", {**outcome.megatron, "source": "preflight job"})
    for part, value in outcome.recorded.items():  # the launchers' settings as preflight saw them (the container)
        ledger.add_provenance(name, part, value)
    view.event(f"preflight {verdict}; {len(outcome.rejected)} candidate(s) rejected, never launched")
    if not outcome.ok:
        preflight.print_table(outcome)
        raise UserError(
            f"preflight failed ({len(failed)} row(s) above, job folder {outcome.folder}): fix them and run the "
            "sweep again, or pass --skip-preflight to launch anyway"
        )
    lift_rules(cfg, outcome.to_dict(), view)


def lift_rules(cfg: RootConfig, evidence: dict, view) -> None:
    """stage.lifted_rules from preflight's evidence (its `lifted`: the fixes the node's checkout carries), not
    from the configuration: a rule is lifted only where the checkout was seen to carry its fix, and the
    output says which rule and why, or that a configured lift was overruled."""
    from orchestrator.plan import rules

    stage = cfg.stage
    if stage is None:
        return
    lifted = sorted(r for r in evidence.get("lifted") or [] if r in rules.LIFTABLE)
    configured = sorted(stage.lifted_rules)
    if configured != lifted:
        view.event(
            f"stage.lifted_rules={configured} replaced by preflight's evidence {lifted}: a rule is lifted only "
            "where the cluster's checkout carries its fix"
        )
    for rid in lifted:
        view.event(f"rule {rid} lifted: the cluster's Megatron checkout carries {rules.BY_ID[rid].lifted_by}")
    stage.lifted_rules = lifted
