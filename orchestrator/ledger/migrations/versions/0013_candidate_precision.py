"""the compute-precision knob: each candidate's precision (knobs.PRECISIONS name)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a candidate before this revision ran its stage's precision, which no stage file changed from the schema's
    # bf16: "bf16", the knob's default
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(sa.Column("precision", sa.String(30), nullable=False, server_default="bf16"))


def downgrade() -> None:
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_column("precision")
