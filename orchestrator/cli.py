"""`python -m orchestrator SUBCOMMAND [flags] [hydra overrides]`.

Each subcommand lives in `orchestrator/commands/<name>.py` and exposes:
    NAME: str, HELP: str, add_arguments(parser), run(args, overrides) -> int
Flags are parsed by argparse; every remaining `key=value` token is a Hydra override.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from orchestrator.config import ConfigError, redact

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


def build_parser():
    parser = Parser(
        prog="python -m orchestrator",
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


def main(argv: list[str] | None = None) -> int:
    parser, handlers = build_parser()
    args, extra = parser.parse_known_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    unknown = [e for e in extra if e.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    overrides = list(getattr(args, "overrides", [])) + extra
    try:
        return int(handlers[args.command].run(args, overrides) or 0)
    except Exception as exc:  # noqa: BLE001 - only user-facing errors are swallowed
        if isinstance(exc, ConfigError) or getattr(exc, "user_facing", False):
            print(f"error: {redact(str(exc), overrides)}", file=sys.stderr)
            return 2
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
