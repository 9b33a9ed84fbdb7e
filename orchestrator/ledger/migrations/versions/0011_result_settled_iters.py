"""learned warm-up: each result's settled_iters (leading iterations above its steady step)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # results before this revision were not read for it: NULL (not measured), never a guess
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("settled_iters", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_column("settled_iters")
