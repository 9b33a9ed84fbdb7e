"""Compose the Hydra config for a subcommand and validate it against `orchestrator.core.schema`.

Why the Compose API and not @hydra.main: the CLI has subcommands with their own flags
(`plan --format json`), so we parse flags with argparse and hand the remaining `key=value`
overrides to Hydra. The result is merged into the typed `RootConfig`, so an unknown key or a
wrong type fails here, once, with the key's path and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import shlex
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core import bounds
from orchestrator.core import redact as core_redact
from orchestrator.core.errors import UserError
from orchestrator.core.schema import RootConfig, StageConfig, legacy_moved, moved_to

if TYPE_CHECKING:  # OmegaConf and Hydra are imported where a config is composed: `--help` never loads them
    from omegaconf import DictConfig, ListConfig
    from omegaconf.errors import OmegaConfBaseException

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
SCHEMA = "schema"  # the ConfigStore name conf/config.yaml's defaults list starts with
GROUPS = ("stage", "model", "hardware", "cluster", "ledger", "policy", "workload")


class ConfigError(UserError):
    """A configuration problem: one message naming the problem and the fix."""


def redact(message: str, overrides: Sequence[str] = ()) -> str:
    """`message` without the password of any URL in it or in the overrides (Hydra quotes a bad override
    whole, and a password with `,` or `'` is one): never print a secret, whatever the error."""
    return core_redact.redact(message, known=[s for o in overrides for s in core_redact.secrets_in(o)])


def available(group: str) -> list[str]:
    """Names of the options of one config group (the YAML files in conf/<group>/)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@dataclass
class Composed:
    cfg: RootConfig  # typed object (dataclasses)
    raw: DictConfig | ListConfig  # the composed config (a DictConfig), for snapshots (YAML) into the ledger

    def to_yaml(self) -> str:
        """The snapshot a sweep stores: its ledger URL masked (exports and reports show the snapshot;
        `resume` takes the URL from the caller). `${oc.env:...}` and `env:VAR` stay as written."""
        from omegaconf import OmegaConf

        from orchestrator.ledger.engine import ENV_PREFIX, mask

        raw = self.raw.copy()
        url = OmegaConf.to_container(raw.ledger, resolve=False)["url"]  # type: ignore[call-overload,index]
        if isinstance(url, str) and "${" not in url and not url.startswith(ENV_PREFIX):
            raw.ledger.url = mask(url)
        return OmegaConf.to_yaml(raw)


def config_keys() -> list[str]:
    """Every dotted key RootConfig accepts (nested dataclasses, the optional stage included): what a typo is
    compared with."""

    def walk(cls: type, prefix: str) -> list[str]:
        out = []
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            out.append(key)
            args = typing.get_args(hints[f.name]) or (hints[f.name],)
            inner = [t for t in args if isinstance(t, type) and dataclasses.is_dataclass(t)]
            if inner:
                out.extend(walk(inner[0], key + "."))
        return out

    return walk(RootConfig, "")


def mapping_keys() -> set[str]:
    """The dotted keys whose value is a mapping (cluster.env, cluster.slurm.sbatch_extra): entries are added."""

    def walk(cls: type, prefix: str) -> set[str]:
        out: set[str] = set()
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints[f.name]) or (hints[f.name],)
            inner = [t for t in args if isinstance(t, type) and dataclasses.is_dataclass(t)]
            if inner:
                out |= walk(inner[0], f"{prefix}{f.name}.")
            elif typing.get_origin(hints[f.name]) is dict:
                out.add(f"{prefix}{f.name}")
        return out

    return walk(RootConfig, "")


def nearest_key(key: str) -> str:
    """ "; did you mean 'policy.name'?" for a typo'd key (difflib), else where the keys are listed. A key that
    moved (orchestrator.core.schema.MOVED_KEYS) is named where it went."""
    bare = key.lstrip("+~")
    if (went := moved_to(bare)) is not None:
        return f"; it moved: {went}"
    close = difflib.get_close_matches(bare, config_keys(), n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return " (the keys are the fields of orchestrator/core/schema.py and the YAML files under conf/)"


def unknown_key(key: str, overrides: Sequence[str]) -> str:
    """The message for an override of a key the composed config lacks: `++` where the schema has the key or
    the key is a new entry of a mapping (cluster.env.FOO), else the nearest key."""
    bare = key.lstrip("+~")
    given = next((o.lstrip("+~") for o in overrides if o.lstrip("+~").startswith(f"{bare}=")), f"{bare}=VALUE")
    if bare in config_keys():  # a schema field the composed config does not hold: Hydra wants it added
        return f"{given}: write ++{given} (the composed config has no {bare}: `++` adds or sets it)"
    parent = bare.rpartition(".")[0]
    if parent in mapping_keys():
        return f"{given}: write ++{given} ({parent} is a mapping: `++` adds an entry to it)"
    return f"unknown config key '{key}'{nearest_key(key)}"


def _hydra_message(msg: str, overrides: Sequence[str]) -> str:
    """One of Hydra's bare messages, rewritten to name the fix: a missing `+`, a typo, a bad group option,
    a quoting problem."""
    missing_plus = re.match(r"Could not override '(\w+)'\. No match in the defaults list", msg)
    if missing_plus and missing_plus.group(1) in GROUPS:
        group = missing_plus.group(1)
        given = next((o for o in overrides if o.startswith(f"{group}=")), f"{group}=NAME")
        return f"{given}: write +{given} (no {group} is chosen by default, so it is added with a `+`)"
    url_with_equals = any(o.lstrip("+").startswith("ledger.url=") and "=" in o.split("=", 1)[1] for o in overrides)
    if "ledger.url" in msg or (url_with_equals and "mismatched input" in msg):  # `?password=x` needs quotes
        return (
            f"invalid override: {msg} (quote a URL holding , ' or =: 'ledger.url=\"...\"', or leave the password "
            "out of the URL: libpq reads PGPASSWORD or ~/.pgpass)"
        )
    unknown = re.match(r"Could not override '([\w.]+)'\.$", msg)
    if unknown:
        return unknown_key(unknown.group(1), overrides)
    for group in GROUPS:
        if f"'{group}'" in msg or f"{group}/" in msg or f"{group}=" in msg:
            listed = ", ".join(available(group))
            return f"invalid override: {msg} (available {group} options: {listed}){nearest_option(group, overrides)}"
    return f"invalid override: {msg}"


def nearest_option(group: str, overrides: Sequence[str]) -> str:
    """ "; did you mean +stage=1k?" for a mistyped group option: the same name in another case first, else the
    closest by difflib; the override is spelled as the user wrote it (with or without `+`)."""
    given = next((o for o in overrides if o.lstrip("+~").startswith(f"{group}=")), None)
    if given is None:
        return ""
    prefix = given[: len(given) - len(given.lstrip("+~"))]
    value = given.split("=", 1)[1]
    options = available(group)
    same = [o for o in options if o.lower() == value.lower()]
    close = same or difflib.get_close_matches(value.lower(), options, n=1, cutoff=0.5)
    return f"; did you mean {prefix}{group}={close[0]}?" if close else ""


SMALL_STAGE = "smoke"  # the stage a fix falls back to: 32 GPUs of the tiny model, legal wherever 4 nodes are


def runnable_fix(command: str, overrides: Sequence[str], runs: Callable[[RootConfig], bool] | None = None) -> str:
    """The command to run instead when the cluster can never run the stage at its size: the stage at the largest
    smaller size (halving) the cluster runs (`runs`; default the registry's refusal) and the planner has a legal
    layout at, else the smoke stage (at its size or a smaller one); "" when none does, or the stage runs as it is.
    Asked, never guessed: `stage.gpus=32`, the partition's size, sent a 1k sweep to "no legal layout" (issue 49)."""
    from orchestrator.plan.planner import plan

    if runs is None:
        from orchestrator.launch import auto

        def runs(cfg: RootConfig) -> bool:
            return auto.refusal(cfg.job_cluster(), cfg.required_stage()) is None

    def plans(args: list[str]) -> bool:
        try:
            cfg = compose(args).cfg
        except ConfigError:  # a size the stage's shape refuses (not a multiple of a node's GPUs)
            return False
        stage = cfg.required_stage()
        return bool(
            plan(cfg.model, cfg.hardware, stage, workload=cfg.workload.name, recipe=cfg.workload.recipe).candidates
        )

    given = compose(overrides).cfg
    if runs(given):
        return ""
    keep = [o for o in overrides if not o.lstrip("+~").startswith(("stage=", "stage.gpus="))]
    chosen = [o for o in overrides if o.lstrip("+~").startswith("stage=")]
    tries = [(chosen, given, False)]
    if given.required_stage().name != SMALL_STAGE:
        try:
            tries.append((["+stage=" + SMALL_STAGE], compose([*keep, "+stage=" + SMALL_STAGE]).cfg, True))
        except ConfigError:  # an override of the user's the small stage refuses: no fix from it
            pass
    for stage_args, cfg, at_own_size in tries:
        n = cfg.required_stage().gpus
        sizes = ([n] if at_own_size else []) + [n >> k for k in range(1, n.bit_length())]
        for size in sizes:
            sized = dataclasses.replace(cfg, stage=dataclasses.replace(cfg.required_stage(), gpus=size))
            args = [*stage_args, *keep, *([] if size == n else [f"stage.gpus={size}"])]
            if runs(sized) and plans(args):
                return f"`python -m orchestrator {command} {' '.join(shlex.quote(a) for a in args)}`"
    return ""


def register_schema() -> None:
    """The typed schema as the first entry of conf/config.yaml's defaults list (Hydra's structured config
    schema): every key exists before a YAML sets it, so `policy.schedule.round_size=3` overrides a default no YAML
    restates, and a YAML key the schema lacks fails at composition."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if f"{SCHEMA}.yaml" not in store.repo:  # once a process: Hydra deep-copies the stored node on every load
        store.store(name=SCHEMA, node=RootConfig)


def compose(overrides: Sequence[str] = (), *, require_stage: bool = False, command: str = "plan") -> Composed:
    """Compose conf/config.yaml with overrides, validate against RootConfig, return both forms.
    `command` names the subcommand in the example a missing stage is answered with."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides)
    if require_stage and not any(o.lstrip("+~").startswith("stage=") for o in overrides):
        extra = " cluster=local" if command in ("sweep", "run-one", "preflight") else ""
        raise ConfigError(
            "no stage given: add +stage=NAME, one of: "
            + ", ".join(available("stage"))
            + f" (e.g. `python -m orchestrator {command} +stage=1k{extra}`)"
        )
    stage_chosen = any(o.lstrip("+~").startswith("stage=") for o in overrides)
    staged = [o for o in overrides if o.lstrip("+~").startswith("stage.")]
    if staged and not stage_chosen:  # Hydra would fail on a None root (an AssertionError, not a message)
        raise ConfigError(
            f"{staged[0]}: no stage is chosen, so there is no stage to set it in: add +stage=NAME, one of: "
            + ", ".join(available("stage"))
        )
    GlobalHydra.instance().clear()
    register_schema()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            raw = hydra_compose(config_name="config", overrides=overrides)
    except HydraException as exc:
        cause = exc.__cause__
        if isinstance(cause, OmegaConfBaseException):  # the schema refused a key or a value
            key = str(getattr(cause, "full_key", "") or "")
            named = [o.split("=", 1)[0] for o in overrides if key and o.split("=", 1)[0].startswith(key)]
            if " not in " in str(cause) and named:  # `polcy.name=x`: an override of a key the schema lacks
                raise ConfigError(unknown_key(named[0], overrides)) from None
            raise ConfigError(_value_message(cause)) from None
        msg = str(exc).strip().splitlines()[0]
        raise ConfigError(_hydra_message(msg, overrides)) from None
    finally:
        GlobalHydra.instance().clear()
    try:
        # As plain data, so a key the schema lacks (added with +) is refused here rather than carried along.
        plain = OmegaConf.create(OmegaConf.to_container(raw, resolve=False))
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), plain)
        typed: RootConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]  # structured: a RootConfig
    except OmegaConfBaseException as exc:
        raise ConfigError(_value_message(exc)) from None
    if typed.stage is not None:
        check_shape(typed)
    from orchestrator.plan import probe

    if typed.workload.probe_mode not in probe.MODES:
        raise ConfigError(
            f"workload.probe_mode={typed.workload.probe_mode!r} is not a probe mode: use one of "
            + ", ".join(f"workload.probe_mode={m}" for m in probe.MODES)
        )
    from orchestrator.launch import auto
    from orchestrator.plan import rules

    out_of_range = bounds.violation(typed)  # before any command writes a row or a file
    if out_of_range is not None:
        raise ConfigError(out_of_range.message())
    try:
        auto.check(typed.cluster)  # every launcher's settings group (cluster.slurm's container), by the registry
        if typed.stage is not None:
            rules.check_lifted(typed.stage.lifted_rules)
    except (UserError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return Composed(cfg=typed, raw=merged)


def check_shape(cfg: RootConfig) -> None:
    """A stage of more than one node fills whole nodes: N a multiple of its GPUs per node (the hardware's); the
    early cut's median has iterations to be over."""
    stage = cfg.required_stage()
    n, gpn = stage.gpus, stage.gpus_per_node
    if n < 0 and gpn >= 1:  # a size the user typed: leave it out, unless the stage has none of its own (custom)
        try:
            compose([f"+stage={stage.name}", f"hardware={cfg.hardware.name}"])
            fix = f"leave stage.gpus out to run the stage at its own size (`+stage={stage.name}`)"
        except ConfigError:
            fix = "e.g. " + " or ".join(f"`+stage={stage.name} stage.gpus={x}`" for x in legal_sizes(cfg, 64 * gpn)[:1])
        raise ConfigError(
            f"stage.gpus={n} is out of range: it must be an integer >= 1, a multiple of the {gpn} GPUs per node of "
            f"hardware {cfg.hardware.name}; {fix}"
        )
    if gpn < 1:
        raise ConfigError(f"stage.gpus_per_node={gpn} must be positive (hardware.gpus_per_node is a host's GPUs)")
    if n < 1:
        example = " or ".join(f"`+stage={stage.name} stage.gpus={x}`" for x in legal_sizes(cfg, 64 * gpn)[:1])
        raise ConfigError(
            f"stage.gpus={n} is out of range: it must be an integer >= 1 (stage {stage.name} has no size: add "
            f"stage.gpus=N, a multiple of the {gpn} GPUs per node of hardware "
            f"{cfg.hardware.name}" + (f", e.g. {example})" if example else ")")
        )
    if n > gpn and n % gpn:
        sizes = legal_sizes(cfg, n) or [n // gpn * gpn, -(-n // gpn) * gpn]
        raise ConfigError(
            f"stage.gpus={n} is not a multiple of the {gpn} GPUs per node of hardware {cfg.hardware.name} "
            f"(stage.gpus_per_node): use " + " or ".join(f"stage.gpus={x}" for x in sizes)
        )
    sc = stage.screen
    if sc.cut_warmup_iters >= sc.cut_after:  # the cut's median would be of no iteration
        raise ConfigError(
            f"stage.screen.cut_warmup_iters={sc.cut_warmup_iters} must be below stage.screen.cut_after="
            f"{sc.cut_after} (the early cut's median is over iterations cut_warmup_iters+1..cut_after): lower it, "
            f"e.g. stage.screen.cut_warmup_iters={sc.cut_after // 3}"
        )


def legal_sizes(cfg: RootConfig, near: int, steps: int = 64) -> list[int]:
    """The multiples of a node's GPUs nearest `near`, below and above (within `steps` nodes), at which the planner
    has a legal layout for the stage: what a size error suggests (the next multiple, 1008 for 1001, has none)."""
    from orchestrator.plan.planner import plan

    stage = cfg.required_stage()
    gpn = stage.gpus_per_node

    def legal(size: int) -> bool:
        sized = dataclasses.replace(stage, gpus=size)
        return bool(
            plan(cfg.model, cfg.hardware, sized, workload=cfg.workload.name, recipe=cfg.workload.recipe).candidates
        )

    lo, hi = near // gpn * gpn, -(-near // gpn) * gpn
    below = next((x for x in range(lo, max(gpn, lo - steps * gpn) - 1, -gpn) if legal(x)), None)
    above = next((x for x in range(max(hi, gpn), hi + steps * gpn + 1, gpn) if x != below and legal(x)), None)
    return [x for x in (below, above) if x is not None]


def _value_message(exc: OmegaConfBaseException) -> str:
    """One line for a value or key the schema refuses, naming the key and the fix."""
    key = getattr(exc, "full_key", None) or "?"
    first = str(exc).strip().splitlines()[0]
    fix = "Fix the override or the YAML file under conf/."
    if " not in " in first and key != "?":  # an added (+) key the schema does not have: a typo?
        fix = f"No such config key{nearest_key(key)}"
    return f"invalid config value at '{key}': {first}. {fix}"


def stage_or_error(composed: Composed) -> StageConfig:
    if composed.cfg.stage is None:
        raise ConfigError("no stage given: add +stage=NAME, one of: " + ", ".join(available("stage")))
    return composed.cfg.stage


def maybe(value: str | None) -> str | None:
    return value if value not in (None, "", "null", "None") else None


def root_from_yaml(text: str) -> RootConfig:
    """The typed config a sweep was created with (its stored snapshot), e.g. for resume or promotion. A snapshot
    from before a key of MOVED_KEYS moved (the cluster's backend settings, the convergence rounds) loads as
    well, each value where its key went."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    snapshot = legacy_moved({str(k): v for k, v in raw.items()}) if isinstance(raw, dict) else raw
    merged = OmegaConf.merge(OmegaConf.structured(RootConfig), OmegaConf.create(snapshot))
    return OmegaConf.to_object(merged)  # type: ignore[return-value]  # structured: a RootConfig
