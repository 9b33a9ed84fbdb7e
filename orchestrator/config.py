"""Compose the Hydra config for a subcommand and validate it against `orchestrator.schema`.

Why the Compose API and not @hydra.main: the CLI has subcommands with their own flags
(`plan --format json`), so we parse flags with argparse and hand the remaining `key=value`
overrides to Hydra. The result is merged into the typed `RootConfig`, so an unknown key or a
wrong type fails here, once, with the key's path and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from orchestrator.errors import UserError
from orchestrator.schema import RootConfig, StageConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


class ConfigError(UserError):
    """A configuration problem: one message naming the problem and the fix."""


def available(group: str) -> list[str]:
    """Names of the options of one config group (the YAML files in conf/<group>/)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@dataclass
class Composed:
    cfg: RootConfig  # typed object (dataclasses)
    raw: DictConfig | ListConfig  # the composed config (a DictConfig), for snapshots (YAML) into the ledger

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(self.raw)


def compose(overrides: Sequence[str] = (), *, require_stage: bool = False) -> Composed:
    """Compose conf/config.yaml with overrides, validate against RootConfig, return both forms."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    overrides = list(overrides)
    if require_stage and not any(o.lstrip("+~").startswith("stage=") for o in overrides):
        raise ConfigError(
            "no stage given: add +stage=NAME, one of: "
            + ", ".join(available("stage"))
            + " (e.g. `python -m orchestrator plan +stage=1k`)"
        )
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            raw = hydra_compose(config_name="config", overrides=overrides)
    except HydraException as exc:
        msg = str(exc).strip().splitlines()[0]
        hint = ""
        for group in ("stage", "model", "hardware", "cluster", "ledger", "policy", "workload"):
            if f"'{group}'" in msg or f"{group}/" in msg or f"{group}=" in msg:
                hint = f" (available {group} options: {', '.join(available(group))})"
                break
        raise ConfigError(f"invalid override: {msg}{hint}") from None
    finally:
        GlobalHydra.instance().clear()
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), raw)
        typed: RootConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]  # structured: a RootConfig
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(
            f"invalid config value at '{key}': {first}. Fix the override or the YAML file under conf/."
        ) from None
    from orchestrator.launch import container

    try:
        container.check(typed.cluster)
    except UserError as exc:
        raise ConfigError(str(exc)) from None
    return Composed(cfg=typed, raw=merged)


def stage_or_error(composed: Composed) -> StageConfig:
    if composed.cfg.stage is None:
        raise ConfigError("no stage given: add +stage=NAME, one of: " + ", ".join(available("stage")))
    return composed.cfg.stage


def maybe(value: str | None) -> str | None:
    return value if value not in (None, "", "null", "None") else None
