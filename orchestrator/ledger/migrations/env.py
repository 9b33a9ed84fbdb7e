"""Alembic environment: runs against the connection (or engine) orchestrator.ledger.engine hands over.

`alembic -c orchestrator/ledger/alembic.ini ...` from a shell also works: it then reads ORCH_LEDGER_URL.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from orchestrator.ledger.engine import make_engine
from orchestrator.ledger.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite ALTER needs table copies
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = config.attributes.get("engine") or make_engine(
        os.environ.get("ORCH_LEDGER_URL", "sqlite:///./ledger.sqlite")
    )
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported for the ledger")
run_migrations_online()
