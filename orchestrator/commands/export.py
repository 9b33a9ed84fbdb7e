"""`export --tensorboard DIR`: each measured run of a sweep (default: every sweep) as TensorBoard event files,
the layout as hyperparameters and step p50/p99, peak memory, tokens/s/GPU and MFU as metrics
(orchestrator.report.tensorboard). Then `tensorboard --logdir DIR`.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands._shared import open_ledger
from orchestrator.core.errors import UserError

NAME = "export"
HELP = "Export measured runs to TensorBoard event files (layout as hparams; p50/p99, memory, tokens/s, MFU)."


def add_arguments(parser) -> None:
    parser.add_argument("--tensorboard", metavar="DIR", help="write event files under DIR/<sweep>/<run>/")
    parser.add_argument("--sweep", default=None, help="one sweep (default: every sweep in the ledger)")


def run(args, overrides) -> int:
    if not args.tensorboard:
        raise UserError("export needs a destination: `python -m orchestrator export --tensorboard DIR`")
    from orchestrator.report import tensorboard

    writer = tensorboard.writer_class()
    if writer is None:  # before the ledger is read: nothing half-written
        raise UserError(f"TensorBoard export needs a writer: {tensorboard.INSTALL}")
    folder = Path(args.tensorboard).expanduser()
    with open_ledger(overrides) as ledger:
        names = [s.name for s in ledger.list_sweeps()]
        if args.sweep is not None and args.sweep not in names:
            raise UserError(f"no sweep named '{args.sweep}' in {ledger.url}; sweeps: {', '.join(names) or 'none'}")
        done = [tensorboard.export(ledger, n, folder, writer) for n in ([args.sweep] if args.sweep else names)]
    for e in done:
        print(f"sweep {e.sweep}: {e.runs} measured runs -> {e.folder}")
    print(f"view them: tensorboard --logdir {folder}")
    return 0
