"""sweeps and their trials

Revision ID: 0003_sweeps
Revises: 0002
Create Date: 2026-12-02 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003_sweeps"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

sweep_status = sa.Enum("running", "completed", "failed", "cancelled", name="sweep_status")


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("project_id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("status", sweep_status, nullable=False),
        sa.Column("request", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("parameter_names", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("max_trials", sa.Integer(), nullable=False),
        sa.Column("max_concurrent", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name=op.f("fk_sweeps_project_id_projects"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    op.create_index(
        "ix_sweeps_project_id_created_at_id",
        "sweeps",
        ["project_id", sa.text("created_at DESC"), sa.text("id DESC")],
        unique=False,
    )
    op.create_index(op.f("ix_sweeps_status"), "sweeps", ["status"], unique=False)
    op.create_table(
        "sweep_trials",
        sa.Column("sweep_id", sa.UUID(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("metric_seq", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.Column("last_value", sa.Double(), nullable=True),
        sa.Column(
            "milestones", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column("stopped_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_sweep_trials_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name=op.f("fk_sweep_trials_sweep_id_sweeps"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("sweep_id", "n", name=op.f("pk_sweep_trials")),
        sa.UniqueConstraint("job_id", name=op.f("uq_sweep_trials_job_id")),
    )


def downgrade() -> None:
    op.drop_table("sweep_trials")
    op.drop_index(op.f("ix_sweeps_status"), table_name="sweeps")
    op.drop_index("ix_sweeps_project_id_created_at_id", table_name="sweeps")
    op.drop_table("sweeps")
    sweep_status.drop(op.get_bind(), checkfirst=True)
