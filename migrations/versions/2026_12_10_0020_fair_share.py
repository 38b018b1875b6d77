"""Fair sharing over a decayed usage history: each project's dominant share, kept on project_usage

Revision ID: 0020_fair_share
Revises: 0019_storage_quota
Create Date: 2026-12-10 14:00:00

- `project_usage.history_cpus` and `history_gpus`: each project's share of the cluster's CPUs and GPUs
  (what its active jobs hold over the cluster's total), averaged over time with a half-life
  (`fair_share_half_life_s`): an exponential moving average the dispatcher's admission round samples
  every `fair_share_sample_s` (api/dispatcher/repository.py, SAMPLE_FAIR_SHARE). A project that held
  half the cluster all day has about 0.5 of it; one that used nothing, 0.
- `cpu_capacity` and `gpu_capacity`: the cluster's totals at the last sample; `sampled_at` (a new row's
  is when it was made, its project's first job starting; the rows there are now start with no sample).
- `share` (generated, stored): the project's dominant share, the larger over CPU and GPU of its history
  plus what it holds now (over the capacity; raw amounts before the first sample). Admission takes
  projects of equal priority in ascending `share` (then age), and every queue position reads the same
  column, so a project that used a lot yesterday yields to one that used nothing.

Rewrites project_usage (one row per project that ever ran a job: small).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_fair_share"
down_revision: str | None = "0019_storage_quota"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def now_share(held: str, capacity: str) -> str:
    """What a project holds now, as a share of the cluster (0 where the cluster has none of it)."""
    return (
        f"CASE WHEN {capacity} IS NULL THEN CAST({held} AS double precision)"
        f" WHEN {capacity} > 0 THEN CAST({held} / {capacity} AS double precision) ELSE 0 END"
    )


SHARE = (
    f"greatest(history_cpus + {now_share('cpus', 'cpu_capacity')}, history_gpus + {now_share('gpus', 'gpu_capacity')})"
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    for column in ("history_cpus", "history_gpus"):
        op.add_column("project_usage", sa.Column(column, sa.Double(), server_default=sa.text("0"), nullable=False))
    op.add_column("project_usage", sa.Column("cpu_capacity", sa.Numeric(), nullable=True))
    op.add_column("project_usage", sa.Column("gpu_capacity", sa.Numeric(), nullable=True))
    # A project's row is made when its first job starts: its first sample weighs the time since then.
    op.add_column(
        "project_usage",
        sa.Column("sampled_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=True),
    )
    op.add_column("project_usage", sa.Column("share", sa.Double(), sa.Computed(SHARE, persisted=True), nullable=False))


def downgrade() -> None:
    for column in ("share", "sampled_at", "gpu_capacity", "cpu_capacity", "history_gpus", "history_cpus"):
        op.drop_column("project_usage", column)
