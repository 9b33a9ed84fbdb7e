"""`best`: the measured best layout of one sweep, as orchestrator.core.ranking decides it (ranking.RULE).

Never chosen on predictions; only complete full-window results count, and a candidate that failed a parity
check is excluded. Without `--sweep` it answers for the most recently started sweep (of `--stage`, if given) and
says which: the best across every stage would compare a 64-GPU slice with a 1k stage, and a `resume` of an
old sweep must not change the answer. A table on a terminal, JSON
(every metric, job id, log paths) with `--format json` or through a pipe; `--flags` prints its Megatron flags.
Each answer carries the winner's evidence bundle (orchestrator.evidence.bundle: Megatron commit, container
digest, TE / DeepEP / NCCL versions, nodes, NCCL/NVTE env, parity verdict); with `--flags` it goes to stderr as
`# ` lines, so stdout stays the flags alone. `--flags` is the measurement's recipe (mock data, a few hundred
iterations, no checkpoints) and says so; `--flags --train` puts the same layout and performance flags on the
training run of the `train` config group (orchestrator.core.schema.TrainConfig: data, tokenizer, length,
LR schedule, seed, save/load, evaluation, logging), rebuilt by orchestrator.plan.argv from the sweep's stored
config; one `# schedule:` stderr line says where each schedule value came from.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from orchestrator.commands._shared import open_ledger
from orchestrator.core import metrics
from orchestrator.core.errors import UserError

if TYPE_CHECKING:
    from orchestrator.core.knobs import Layout

NAME = "best"
HELP = (
    "The best measured layout of a sweep (step p50, then p99, then lower peak memory) with its evidence; "
    "default: the most recently started sweep."
)


def add_arguments(parser) -> None:
    parser.add_argument("--sweep", default=None, help="sweep name (default: the most recently started sweep)")
    parser.add_argument("--stage", default=None, help="the most recently started sweep of this stage (e.g. 1k)")
    parser.add_argument(
        "--format", choices=["json", "table"], default=None, help="default: table on a terminal, else json"
    )
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    parser.add_argument(
        "--flags", action="store_true", help="print the exact Megatron flags the best layout's job ran with"
    )
    parser.add_argument(
        "--train",
        action="store_true",
        help="with --flags: the best layout on the training run of conf/train/ (data, tokenizer, save/load, eval)",
    )


def pick_sweep(ledger, name: str | None, stage: str | None):
    """The sweep `best` answers for: the named one, else the most recently started (of `stage`, if given):
    started, not touched, so a `resume` of an old sweep does not change which one answers.
    A UserError lists the sweeps when there is no such sweep."""
    sweeps = ledger.list_sweeps()
    known = ", ".join(s.name for s in sweeps) or "none"
    if name is not None:
        row = next((s for s in sweeps if s.name == name), None)
        if row is None:
            raise UserError(f"no sweep named '{name}' in {ledger.url}; sweeps: {known}")
        if stage is not None and row.stage != stage:
            raise UserError(f"sweep '{name}' is stage {row.stage}, not {stage}: drop --stage or name another sweep")
        return row
    pool = [s for s in sweeps if stage is None or s.stage == stage]
    if not pool:
        where = f" of stage {stage}" if stage else ""
        raise UserError(f"no sweep{where} in {ledger.url} (sweeps: {known}); run one: `python -m orchestrator sweep`")
    return max(pool, key=lambda s: (s.created_at, s.id))


def flags_of(hit: dict, layout: Layout, config_yaml: str) -> list[str]:
    """The Megatron flags of the best attempt: its job.json as launched, else rebuilt from the sweep's stored
    config (a job folder on another machine) with the same function the job got them from."""
    from pathlib import Path

    from orchestrator.core.paths import JobPaths
    from orchestrator.core.spec import JobSpec

    spec_path = JobPaths(Path(hit["attempt"]["job_dir"])).spec
    if spec_path.is_file():
        spec = JobSpec.load(spec_path)
        return [*spec.argv, *spec.workload.extra_args]
    from orchestrator.config import root_from_yaml
    from orchestrator.runspec import layout_flags

    cfg = root_from_yaml(config_yaml)
    return layout_flags(cfg, cfg.required_stage(), layout, hit["layer_pattern"])


def train_flags_of(hit: dict, layout: Layout, config_yaml: str, train) -> list[str]:
    """The best layout on a training run (`train`, a TrainConfig): the sweep's stored model, stage, recipe and
    layout through the same argv builder the jobs got theirs from, with the run's data, length and checkpoints."""
    from orchestrator.config import root_from_yaml
    from orchestrator.runspec import layout_flags

    cfg = root_from_yaml(config_yaml)
    return layout_flags(cfg, cfg.required_stage(), layout, hit["layer_pattern"], train=train)


def schedule_line(config_yaml: str, train) -> str:
    """One `# schedule:` line: each LR-schedule, seed and logging value of the training run with where it came
    from (the schema's default and its source, the site's setting, the performance recipe it keeps)."""
    from orchestrator.config import root_from_yaml
    from orchestrator.plan.argv import train_schedule

    rows = train_schedule(train, root_from_yaml(config_yaml).workload.recipe)
    return "# schedule: " + "; ".join(f"{name} {value} ({source})" for name, value, source in rows)


def check_schedule(train) -> None:
    """Megatron's scheduler asserts a floor at most the peak and a warm-up that ends before the decay
    (megatron/core/optimizer_param_scheduler.py:161,170): say so here, in the train group's words."""
    if train.min_lr > train.lr:
        raise UserError(
            f"train.min_lr={train.min_lr} is above the peak train.lr={train.lr}: set train.min_lr={train.lr / 10:g}"
        )
    decay = train.lr_decay_iters if train.lr_decay_iters is not None else train.train_iters
    if train.lr_warmup_iters >= decay:
        raise UserError(
            f"train.lr_warmup_iters={train.lr_warmup_iters} is not below the {decay} iterations the LR decays over "
            f"(train.lr_decay_iters, else train.train_iters): set train.lr_warmup_iters={max(decay // 10, 0)} "
            "or a longer train.train_iters"
        )


def summary_rows(hit: dict, layout: Layout) -> list[tuple[str, str]]:
    """The evidence a decision needs, one field a line (the JSON has every metric)."""
    from orchestrator.core.knobs import optim_text, precision_text

    m, a = hit["metrics"], hit["attempt"]

    def num(key: str) -> str:  # as the metric registry prints it, with its unit
        return metrics.text(key, m.get(key))

    sim = " (simulated)" if hit["simulated"] else ""
    return [
        ("layout", layout.short()),
        ("compute numerics", precision_text(layout.precision)),  # training semantics (RecipeConfig.precision)
        ("optimizer numerics", optim_text(layout.optim)),  # training semantics the winner chose (RecipeConfig.optim)
        ("step p50 / p99", f"{num(metrics.STEP_P50)} / {num(metrics.STEP_P99)}{sim}"),
        ("tokens/s/GPU", num("tokens_per_s_per_gpu")),
        ("peak reserved memory", num("peak_reserved_gb")),
        ("token drop", num("token_drop_fraction")),
        ("job", f"{a['job_id']} ({a['state']}) attempt {a['attempt_no']}, round {hit['round']}"),
        ("job folder", str(a["job_dir"])),
        ("chosen on", hit["chosen_on"]),
        ("candidate key", hit["key"]),
    ]


def _bundle(ledger, sweep, hit: dict):
    """The winner's evidence bundle: the result's versions and env, its parity rows, the sweep's provenance."""
    import yaml

    from orchestrator.evidence import bundle

    try:
        enabled = bool(((yaml.safe_load(sweep.config_yaml) or {}).get("parity") or {}).get("enabled"))
    except (yaml.YAMLError, AttributeError):
        enabled = None
    return bundle.of_best(
        hit, parity=ledger.evidence.parity(hit["candidate_id"]), provenance=sweep.provenance, parity_enabled=enabled
    )


def run(args, overrides) -> int:
    from orchestrator.ledger import queries

    if args.train and not args.flags:
        raise UserError("--train goes with --flags: `python -m orchestrator best --flags --train`")
    from orchestrator.config import compose

    train = compose(overrides).cfg.train if args.train else None
    if train is not None:
        check_schedule(train)
    with open_ledger(overrides) as ledger:
        sweep = pick_sweep(ledger, args.sweep, args.stage)
        hit = queries.best(ledger, sweep=sweep.name)
        url = ledger.url
        bundle = _bundle(ledger, sweep, hit) if hit is not None else None
        cand = ledger.candidate_by_key(sweep.name, hit["key"]) if hit is not None else None
    if args.sweep is None:
        scope = f" of stage {args.stage}" if args.stage else ""
        print(
            f"best of sweep {sweep.name} (stage {sweep.stage}; the most recently started sweep{scope}: "
            "--sweep NAME or --stage STAGE picks another)",
            file=sys.stderr,
        )
    if hit is None:
        raise UserError(
            f"sweep '{sweep.name}' has no successful, non-partial measured result yet ({url}): "
            f"see `python -m orchestrator status {sweep.name}`, or resume it"
        )
    assert cand is not None  # the best is a candidate of the sweep
    layout = cand.layout
    if args.flags:
        from orchestrator.runspec import format_argv

        if train is not None:
            from orchestrator.plan.argv import train_placeholders

            print(format_argv(train_flags_of(hit, layout, sweep.config_yaml, train)))
            print(
                "# recipe: training run (conf/train/: data, tokenizer, length, LR schedule, seed, save/load, eval, "
                "logging)",
                file=sys.stderr,
            )
            print(schedule_line(sweep.config_yaml, train), file=sys.stderr)
            missing = ", ".join(f"train.{name}" for name in train_placeholders(train))
            if missing:
                print(
                    f"# unset: {missing} are <placeholders>: fill them once in conf/train/default.yaml "
                    "(or pass train.save=DIR ...)",
                    file=sys.stderr,
                )
        else:
            print(format_argv(flags_of(hit, layout, sweep.config_yaml)))
            print(
                "# recipe: measurement (mock data, NullTokenizer, warm-up + window iterations, no save/load); "
                "add --train for the training run",
                file=sys.stderr,
            )
        for k, v in bundle.rows() if bundle else ():
            print(f"# {k}: {v}", file=sys.stderr)
        return 0
    fmt = args.format or ("table" if sys.stdout.isatty() else "json")
    if fmt == "json":
        json.dump({**hit, "bundle": bundle.to_dict() if bundle else None}, sys.stdout, indent=1, default=str)
        print()
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"best of sweep {sweep.name} (stage {sweep.stage})", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for k, v in summary_rows(hit, layout) + (bundle.rows() if bundle else []):
        table.add_row(k, v)
    console = Console()
    console.print(table)
    console.print(f"Megatron flags: python -m orchestrator best --sweep {sweep.name} --flags", highlight=False)
    return 0
