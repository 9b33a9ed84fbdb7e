"""effective throughput on results: steady tokens/s after a restart, effective fraction, Q_effective

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tokens_per_s_after_restart", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("effective_fraction", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("q_effective", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_column("q_effective")
        batch_op.drop_column("effective_fraction")
        batch_op.drop_column("tokens_per_s_after_restart")
