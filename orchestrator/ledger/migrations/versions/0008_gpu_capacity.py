"""GPU capacity from the evidence: what each attempt's OOM message or device properties said the GPU holds

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # attempts before this revision stated nothing: NULL (the sweep plans with hardware.hbm_gb)
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_capacity_gb", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("gpu_capacity_source", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("gpu_capacity_source")
        batch_op.drop_column("gpu_capacity_gb")
