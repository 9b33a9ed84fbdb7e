"""per-dispatch expert-parallel load on results (hot EP rank percentiles, hot expert) and unmeasured token drop

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

HOT_RANK = [f"hot_rank_{what}_p{q}" for what in ("tokens", "share") for q in (50, 95, 99)]


def upgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_drop_note", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("hot_expert", sa.String(length=64), nullable=True))
        for name in HOT_RANK:
            batch_op.add_column(sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        for name in reversed(HOT_RANK):
            batch_op.drop_column(name)
        batch_op.drop_column("hot_expert")
        batch_op.drop_column("token_drop_note")
