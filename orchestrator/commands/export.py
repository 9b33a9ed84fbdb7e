"""`export`: the measured runs where ML teams look, and the winner where they train.

- `--tensorboard DIR`: each measured run as TensorBoard event files (orchestrator.report.tensorboard).
- `--mlflow [DIR|URI]`, `--wandb`: each measured run in MLflow (a local store in DIR, default ./mlruns, or a
  tracking server by URL) or Weights & Biases (online, or offline with WANDB_MODE=offline), with its layout as
  params, p50/p95/p99, peak memory, token drop, tokens/s and MFU as metrics and its evidence bundle as an
  artifact (orchestrator.report.tracking). Exporting again writes only candidates with a newer result.
- `--bridge FILE`: the measured best of one sweep as a Megatron-Bridge recipe override (orchestrator.report.bridge).

Every sweep by default (`--bridge`: the most recently started one); `--sweep NAME` picks one.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.commands._shared import open_ledger
from orchestrator.core.errors import UserError

NAME = "export"
HELP = (
    "Export measured runs to TensorBoard, MLflow or Weights & Biases (layout as params; p50/p95/p99, memory, "
    "token drop, tokens/s, MFU; the evidence bundle), or the best layout as a Megatron-Bridge override."
)
MLFLOW_DIR = "mlruns"  # `--mlflow` without a value: a local store in this folder


def add_arguments(parser) -> None:
    parser.add_argument("--tensorboard", metavar="DIR", help="write event files under DIR/<sweep>/<run>/")
    parser.add_argument(
        "--mlflow",
        nargs="?",
        const=MLFLOW_DIR,
        metavar="DIR|URI",
        help=f"MLflow: a local store in DIR (default ./{MLFLOW_DIR}) or a tracking server URL",
    )
    parser.add_argument(
        "--wandb", action="store_true", help="Weights & Biases (WANDB_MODE=offline: run folders under WANDB_DIR)"
    )
    parser.add_argument(
        "--project",
        default=None,
        help="MLflow experiment / W&B project (default: $WANDB_PROJECT, else dsv4-orchestrator)",
    )
    parser.add_argument(
        "--bridge", metavar="FILE", help="write the best layout as a Megatron-Bridge recipe override (YAML)"
    )
    parser.add_argument("--sweep", default=None, help="one sweep (default: every sweep in the ledger)")


def _writers(args) -> None:
    """Each asked-for library is importable (before the ledger is read: nothing half-written)."""
    if args.tensorboard:
        from orchestrator.report import tensorboard

        if tensorboard.writer_class() is None:
            raise UserError(f"TensorBoard export needs a writer: {tensorboard.INSTALL}")
    if args.mlflow or args.wandb:
        from orchestrator.report import tracking

        if args.mlflow and tracking.mlflow_client() is None:
            raise UserError(f"MLflow export needs mlflow: {tracking.INSTALL} (or pip install mlflow-skinny)")
        if args.wandb and tracking.wandb_module() is None:
            raise UserError(f"Weights & Biases export needs wandb: {tracking.INSTALL} (or pip install wandb)")


def run(args, overrides) -> int:
    if not (args.tensorboard or args.mlflow or args.wandb or args.bridge):
        raise UserError(
            "export needs a destination: `python -m orchestrator export --mlflow` "
            "(or --wandb, --tensorboard DIR, --bridge FILE)"
        )
    _writers(args)
    with open_ledger(overrides) as ledger:
        names = [s.name for s in ledger.list_sweeps()]
        if args.sweep is not None and args.sweep not in names:
            raise UserError(f"no sweep named '{args.sweep}' in {ledger.url}; sweeps: {', '.join(names) or 'none'}")
        sweeps = [args.sweep] if args.sweep else names
        if args.bridge:
            _bridge(ledger, args)
        if args.tensorboard:
            _tensorboard(ledger, sweeps, Path(args.tensorboard).expanduser())
        if args.mlflow or args.wandb:
            _trackers(ledger, sweeps, args)
    return 0


def _tensorboard(ledger, sweeps: list[str], folder: Path) -> None:
    from orchestrator.report import tensorboard

    writer = tensorboard.writer_class()
    for e in [tensorboard.export(ledger, n, folder, writer) for n in sweeps]:
        print(f"sweep {e.sweep}: {e.runs} measured runs -> {e.folder}")
    print(f"view them: tensorboard --logdir {folder}")


def _trackers(ledger, sweeps: list[str], args) -> None:
    from orchestrator.core.redact import redact
    from orchestrator.report import tracking

    project = args.project or os.environ.get("WANDB_PROJECT") or tracking.PROJECT
    for name in sweeps:
        runs = tracking.runs(ledger, name)
        if args.mlflow:
            e = tracking.to_mlflow(runs, args.mlflow, project)
            print(f"sweep {name}: MLflow {e.written} run(s) written, {e.unchanged} unchanged -> {redact(e.where)}")
        if args.wandb:
            e = tracking.to_wandb(runs, project)
            print(f"sweep {name}: W&B {e.written} run(s) written, {e.unchanged} unchanged -> {e.where}")
    if args.mlflow:
        uri, _ = tracking.mlflow_store(args.mlflow)
        print(f"view them: mlflow ui --backend-store-uri {redact(uri)} (experiment {project})")
    if args.wandb and os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun"):
        print("upload them: wandb sync --sync-all (in the folder that holds wandb/)")


def _bridge(ledger, args) -> None:
    from orchestrator.commands.best import flags_of, pick_sweep
    from orchestrator.core.paths import atomic_write
    from orchestrator.ledger import queries
    from orchestrator.report import bridge

    sweep = pick_sweep(ledger, args.sweep, None)
    hit = queries.best(ledger, sweep=sweep.name)
    if hit is None:
        raise UserError(
            f"sweep '{sweep.name}' has no successful, non-partial measured result yet ({ledger.url}): "
            f"see `python -m orchestrator status {sweep.name}`, or resume it"
        )
    cand = ledger.candidate_by_key(sweep.name, hit["key"])
    assert cand is not None  # the best is a candidate of the sweep
    layout = cand.layout
    values = bridge.override(flags_of(hit, layout, sweep.config_yaml), layout)
    m = hit["metrics"]
    sim = " SIMULATED (the twin: no Megatron ran; check on GPUs before training)" if hit["simulated"] else ""
    header = [
        f"Megatron-Bridge override: the measured best of sweep {sweep.name} (stage {sweep.stage}, {sweep.model} "
        f"on {sweep.hardware}){sim}",
        f"layout {layout.short()}; step p50 {m.get('step_p50_s')} s; candidate {hit['candidate_id']} key {hit['key']}",
        f"measured layer pattern (Bridge's V4 recipe splits the pipeline evenly itself): {hit['layer_pattern']}",
        "use: OmegaConf.merge it into the recipe's config, or pass the line below to scripts/training/run_recipe.py",
    ]
    path = Path(args.bridge).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, bridge.render(values, header=header))
    print(f"sweep {sweep.name}: best layout {layout.short()} -> Megatron-Bridge override {path}")
