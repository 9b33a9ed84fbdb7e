"""initial schema: sweep, lease, candidate, attempt, result, step samples, rank memory, events

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("stage", sa.String(length=50), nullable=False),
        sa.Column("model", sa.String(length=100), nullable=False),
        sa.Column("hardware", sa.String(length=100), nullable=False),
        sa.Column("workload", sa.String(length=100), nullable=False),
        sa.Column("config_yaml", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=30), nullable=False),
        sa.Column("provenance", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep")),
        sa.UniqueConstraint("name", name=op.f("uq_sweep_name")),
    )
    op.create_table(
        "candidate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("tp", sa.Integer(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("vpp", sa.Integer(), nullable=False),
        sa.Column("cp", sa.Integer(), nullable=False),
        sa.Column("ep", sa.Integer(), nullable=False),
        sa.Column("etp", sa.Integer(), nullable=False),
        sa.Column("mbs", sa.Integer(), nullable=False),
        sa.Column("recompute", sa.String(length=200), nullable=False),
        sa.Column("offload", sa.String(length=200), nullable=False),
        sa.Column("dispatcher", sa.String(length=30), nullable=False),
        sa.Column("backend", sa.String(length=30), nullable=True),
        sa.Column("capacity_factor", sa.Double(), nullable=True),
        sa.Column("use_tp_pp_dp_mapping", sa.Boolean(), nullable=False),
        sa.Column("layer_pattern", sa.Text(), nullable=False),
        sa.Column("layout", sa.JSON(), nullable=False),
        sa.Column("pred_step_time_s", sa.Double(), nullable=True),
        sa.Column("pred_memory_gb", sa.Double(), nullable=True),
        sa.Column("pred_mfu", sa.Double(), nullable=True),
        sa.Column("pred_tokens_per_s", sa.Double(), nullable=True),
        sa.Column("pred_bubble", sa.Double(), nullable=True),
        sa.Column("d_a", sa.Integer(), nullable=True),
        sa.Column("d_e", sa.Integer(), nullable=True),
        sa.Column("m", sa.Integer(), nullable=True),
        sa.Column("feasible", sa.Boolean(), nullable=True),
        sa.Column("predicted", sa.JSON(), nullable=False),
        sa.Column("verdict", sa.String(length=500), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("edge_kind", sa.String(length=30), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("latest_attempt_id", sa.Integer(), nullable=True),
        sa.Column("latest_result_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["parent_id"], ["candidate.id"], name=op.f("fk_candidate_parent_id_candidate"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweep.id"], name=op.f("fk_candidate_sweep_id_sweep"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_candidate")),
        sa.UniqueConstraint("sweep_id", "key", name=op.f("uq_candidate_sweep_id_key")),
    )
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.create_index("ix_candidate_sweep_status", ["sweep_id", "status"], unique=False)

    op.create_table(
        "lease",
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("acquired_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweep.id"], name=op.f("fk_lease_sweep_id_sweep"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sweep_id", name=op.f("pk_lease")),
    )
    op.create_table(
        "attempt",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.Column("array_index", sa.Integer(), nullable=True),
        sa.Column("job_dir", sa.Text(), nullable=False),
        sa.Column("submit_time", sa.DateTime(), nullable=True),
        sa.Column("start_time", sa.DateTime(), nullable=True),
        sa.Column("end_time", sa.DateTime(), nullable=True),
        sa.Column("node_list", sa.Text(), nullable=True),
        sa.Column("state", sa.String(length=30), nullable=False),
        sa.Column("failure_class", sa.String(length=30), nullable=True),
        sa.Column("failure_detail", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("log_paths", sa.JSON(), nullable=False),
        sa.Column("sidecar_paths", sa.JSON(), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["candidate_id"], ["candidate.id"], name=op.f("fk_attempt_candidate_id_candidate"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempt")),
        sa.UniqueConstraint("candidate_id", "attempt_no", name=op.f("uq_attempt_candidate_id_attempt_no")),
    )
    op.create_table(
        "event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=30), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["candidate_id"], ["candidate.id"], name=op.f("fk_event_candidate_id_candidate"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweep.id"], name=op.f("fk_event_sweep_id_sweep"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event")),
    )
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.create_index("ix_event_sweep_id_id", ["sweep_id", "id"], unique=False)

    op.create_table(
        "rank_memory",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("pp_stage", sa.Integer(), nullable=True),
        sa.Column("allocated_mb", sa.Double(), nullable=True),
        sa.Column("reserved_mb", sa.Double(), nullable=True),
        sa.Column("source", sa.String(length=20), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempt.id"], name=op.f("fk_rank_memory_attempt_id_attempt"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rank_memory")),
        sa.UniqueConstraint("attempt_id", "rank", name=op.f("uq_rank_memory_attempt_id_rank")),
    )
    op.create_table(
        "result",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("partial", sa.Boolean(), nullable=False),
        sa.Column("warmup_iters", sa.Integer(), nullable=False),
        sa.Column("measure_iters_requested", sa.Integer(), nullable=False),
        sa.Column("measure_iters", sa.Integer(), nullable=False),
        sa.Column("step_p50_s", sa.Double(), nullable=True),
        sa.Column("step_p95_s", sa.Double(), nullable=True),
        sa.Column("step_p99_s", sa.Double(), nullable=True),
        sa.Column("step_mean_s", sa.Double(), nullable=True),
        sa.Column("step_max_s", sa.Double(), nullable=True),
        sa.Column("tokens_per_s", sa.Double(), nullable=True),
        sa.Column("tokens_per_s_per_gpu", sa.Double(), nullable=True),
        sa.Column("tflops_per_gpu", sa.Double(), nullable=True),
        sa.Column("mfu", sa.Double(), nullable=True),
        sa.Column("mfu_peak", sa.String(length=100), nullable=False),
        sa.Column("megatron_tflops_per_gpu", sa.Double(), nullable=True),
        sa.Column("recompute_tflops_per_gpu", sa.Double(), nullable=True),
        sa.Column("heaviest_rank", sa.Integer(), nullable=True),
        sa.Column("heaviest_pp_stage", sa.Integer(), nullable=True),
        sa.Column("peak_allocated_gb", sa.Double(), nullable=True),
        sa.Column("peak_reserved_gb", sa.Double(), nullable=True),
        sa.Column("slowest_rank", sa.Integer(), nullable=True),
        sa.Column("slowest_stage", sa.Integer(), nullable=True),
        sa.Column("token_drop_fraction", sa.Double(), nullable=True),
        sa.Column("padding_fraction", sa.Double(), nullable=True),
        sa.Column("expert_load_p50", sa.Double(), nullable=True),
        sa.Column("expert_load_p95", sa.Double(), nullable=True),
        sa.Column("expert_load_p99", sa.Double(), nullable=True),
        sa.Column("hot_expert_ratio", sa.Double(), nullable=True),
        sa.Column("force_balanced_routing", sa.Boolean(), nullable=False),
        sa.Column("ckpt_save_s", sa.Double(), nullable=True),
        sa.Column("ckpt_restore_s", sa.Double(), nullable=True),
        sa.Column("timers_ms", sa.JSON(), nullable=False),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempt.id"], name=op.f("fk_result_attempt_id_attempt"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["candidate_id"], ["candidate.id"], name=op.f("fk_result_candidate_id_candidate"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_result")),
        sa.UniqueConstraint("attempt_id", name=op.f("uq_result_attempt_id")),
    )
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_result_candidate_id"), ["candidate_id"], unique=False)

    op.create_table(
        "step_sample",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("step_time_s", sa.Double(), nullable=True),
        sa.Column("lm_loss", sa.Double(), nullable=True),
        sa.Column("grad_norm", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempt.id"], name=op.f("fk_step_sample_attempt_id_attempt"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_sample")),
        sa.UniqueConstraint("attempt_id", "iteration", name=op.f("uq_step_sample_attempt_id_iteration")),
    )


def downgrade() -> None:
    op.drop_table("step_sample")
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_result_candidate_id"))

    op.drop_table("result")
    op.drop_table("rank_memory")
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.drop_index("ix_event_sweep_id_id")

    op.drop_table("event")
    op.drop_table("attempt")
    op.drop_table("lease")
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_index("ix_candidate_sweep_status")

    op.drop_table("candidate")
    op.drop_table("sweep")
