"""`db upgrade|current|history`: the ledger's schema revisions (Alembic, orchestrator/ledger/migrations).

A fresh SQLite file is upgraded on first use anyway; a PostgreSQL ledger changes only here.
"""

from __future__ import annotations

from orchestrator.commands._shared import split_verb
from orchestrator.config import compose

NAME = "db"
HELP = "Ledger schema: `db upgrade` (to head or --revision), `db current`, `db history`."
VERBS = ("upgrade", "current", "history")


def add_arguments(parser) -> None:
    parser.add_argument("--revision", default="head", help="upgrade: target revision (default head)")


def run(args, overrides) -> int:
    from orchestrator.ledger import engine as E

    verb, overrides = split_verb(overrides, VERBS, NAME)
    if verb == "history":
        for line in E.history():
            print(line)
        return 0
    cfg = compose(overrides).cfg.ledger
    url = E.parse_url(cfg.url)
    target = E.sqlite_target(url)  # a file: URI names its file after the scheme
    if verb == "current" and target and not target.problem and target.path and not target.path.exists():
        print(f"ledger {E.mask(url)}: no file yet (`sweep` or `db upgrade` creates it)")
        return 0
    E.sqlite_file(url, create=verb == "upgrade", create_dir=cfg.create_dir)
    eng = E.make_engine(cfg.url, busy_timeout_ms=cfg.busy_timeout_ms)
    try:
        before = E.schema_state(eng)
        if verb == "current":
            where = "head" if before.up_to_date else f"behind head {before.head}: run `db upgrade`"
            print(f"ledger {E.mask(cfg.url)}: revision {before.current or 'none (empty database)'} ({where})")
            return 0
        after = E.upgrade(eng, args.revision)
        change = "already at" if after.current == before.current else f"upgraded from {before.current or 'empty'} to"
        print(f"ledger {E.mask(cfg.url)}: {change} {after.current}")
        return 0
    finally:
        eng.dispose()
