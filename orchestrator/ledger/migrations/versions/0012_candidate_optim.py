"""the optimizer-precision knob: each candidate's optim (knobs.OPTIM_DTYPES name)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a candidate before this revision ran the recipe's dtypes, which were FP32 unless a recipe file changed them:
    # "fp32", the knob's default (Megatron's, no precision-aware optimizer)
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(sa.Column("optim", sa.String(30), nullable=False, server_default="fp32"))


def downgrade() -> None:
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_column("optim")
