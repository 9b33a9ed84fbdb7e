"""`python -m orchestrator SUBCOMMAND [flags] [hydra overrides]`.

Each subcommand lives in `orchestrator/commands/<name>.py` and exposes:
    NAME: str, HELP: str, add_arguments(parser), run(args, overrides) -> int
Flags are parsed by argparse; every remaining `key=value` token is a Hydra override.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from typing import NoReturn

from orchestrator.config import ConfigError, redact
from orchestrator.core.errors import Interrupted
from orchestrator.core.paths import disk_full

# Order = order in --help. Add a module here when you add a subcommand.
COMMANDS = [
    "plan",
    "preflight",
    "run_one",
    "sweep",
    "resume",
    "status",
    "cancel",
    "compare",
    "best",
    "db",
    "ledger",
    "report",
    "export",
    "validate",
]


def _load_commands():
    return [importlib.import_module(f"orchestrator.commands.{name}") for name in COMMANDS]


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error is one `error:` line and exit 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


CONSOLE = "dsv4-orchestrator"  # pyproject's [project.scripts] name: the command outside the checkout and venv


def build_parser(prog: str = "python -m orchestrator"):
    parser = Parser(
        prog=prog,
        description="Plan, launch, measure and compare Megatron-LM parallel layouts for DeepSeek-V4.",
        epilog="Hydra overrides (key=value, +stage=1k, model=tiny, hardware=h200) may follow any subcommand.",
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    handlers = {}
    for mod in _load_commands():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)  # a command's own positionals (e.g. a sweep NAME) come before the overrides
        p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +stage=1k hardware=h200")
        handlers[mod.NAME] = mod
    return parser, handlers


def main(argv: list[str] | None = None, *, prog: str = "python -m orchestrator") -> int:
    parser, handlers = build_parser(prog)
    args, extra = parser.parse_known_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    unknown = [e for e in extra if e.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    overrides = list(getattr(args, "overrides", [])) + extra
    before = _on_sigterm()
    try:
        return int(handlers[args.command].run(args, overrides) or 0)
    except Exception as exc:  # noqa: BLE001 - only user-facing errors are swallowed
        user = exc if isinstance(exc, ConfigError) or getattr(exc, "user_facing", False) else disk_full(exc)
        if user is not None:  # a full disk anywhere is one line too (a sweep's says `resume NAME`: carry_on)
            print(f"error: {redact(str(user), overrides)}", file=sys.stderr)
            return 2
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (_on_sigterm): what stopped, and how to go on
        stop = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
        print(redact(str(stop), overrides), file=sys.stderr)
        return 128 + stop.signum
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def _on_sigterm():
    """SIGTERM (kill, systemd, Slurm ending the driver's job) stops a command as Ctrl-C does, so its cleanup runs
    and it says what stopped it; the default action ended the driver at once, exit 143, without a word. Returns
    the handler it replaced (None: not the main thread, where Python takes no handler)."""

    def stop(signum, _frame) -> NoReturn:
        raise Interrupted(signum)

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:
        return None


def console() -> NoReturn:
    """`dsv4-orchestrator ...` (pip installs it on PATH): `python -m orchestrator` under the name it was called by."""
    if hasattr(signal, "SIGPIPE"):  # `... | head` ends quietly, like any Unix tool
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    raise SystemExit(main(prog=CONSOLE))
