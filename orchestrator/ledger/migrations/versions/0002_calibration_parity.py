"""calibration and parity tables: fits of the planner against the ledger, numerical parity checks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calibration",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("fit", sa.JSON(), nullable=False),
        sa.Column("error", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweep.id"], name=op.f("fk_calibration_sweep_id_sweep"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibration")),
    )
    with op.batch_alter_table("calibration", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_calibration_sweep_id"), ["sweep_id"], unique=False)

    op.create_table(
        "parity",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("reference_key", sa.String(length=64), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("max_loss_diff", sa.Double(), nullable=True),
        sa.Column("max_grad_norm_diff", sa.Double(), nullable=True),
        sa.Column("tolerance", sa.Double(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["candidate_id"], ["candidate.id"], name=op.f("fk_parity_candidate_id_candidate"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_parity")),
    )
    with op.batch_alter_table("parity", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_parity_candidate_id"), ["candidate_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("parity", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_parity_candidate_id"))

    op.drop_table("parity")
    with op.batch_alter_table("calibration", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_calibration_sweep_id"))

    op.drop_table("calibration")
