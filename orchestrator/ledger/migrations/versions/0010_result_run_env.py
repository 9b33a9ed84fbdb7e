"""evidence bundle: each result's NCCL/NVTE environment as its ranks saw it (versions already has its JSON)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # results before this revision recorded no environment: an empty object, not a guess
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("run_env", sa.JSON(), nullable=False, server_default=sa.text("'{}'")))


def downgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_column("run_env")
