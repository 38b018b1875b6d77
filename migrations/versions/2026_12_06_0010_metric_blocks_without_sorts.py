"""metric_blocks kept up to date with plain aggregates: the extremes found by min()/max(), not eight sorts

Revision ID: 0010_blocks_no_sorts
Revises: 0009_points_job_check
Create Date: 2026-12-06 10:00:00

The statement trigger of migration 0005 summarised each inserted block with eight ordered array_agg()
calls, each sorting the block's new points: a large part of what PostgreSQL spends storing a batch
of 1,000 points (EXPLAIN ANALYZE, bench/README.md), all of it inside the job's ingest lock. The same
summary now in one pass without a sort: count, min and max per block, and the extremes as min() and
max() of (value, seq) arrays (array order is element order: the lowest seq wins a tie, NaN is the
highest value, as in PostgreSQL's ordering of float8); their step and time are read back by seq. seq
travels as a float8 element: exact below 2^53. Same rows as before, on conflict merged as before.

Online: CREATE OR REPLACE FUNCTION changes the catalog only; the trigger stays as it is.
"""

import importlib.util
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0010_blocks_no_sorts"
down_revision: str | None = "0009_points_job_check"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


@cache
def _scale_revision() -> Any:
    """Migration 0005's module, read from its file (revisions are not a package) when this one runs, not
    when alembic loads every revision: this one keeps its merge and puts its function back on downgrade."""
    path = Path(__file__).with_name("2026_12_02_0005_scale_counters_blocks_retention.py")
    spec = importlib.util.spec_from_file_location("tm_migration_0005", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _faster() -> str:
    merge = "ON CONFLICT" + str(_scale_revision().BLOCKS_FROM).partition("ON CONFLICT")[2]  # 0005's, unchanged
    return f"""
CREATE OR REPLACE FUNCTION tm_metric_blocks_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH summary AS (
        SELECT job_id, name, rank, seq >> 12 AS block, count(*) AS n, count(step) AS stepped,
               min(step) AS min_step, max(step) AS max_step,
               min(ARRAY[value, seq]) AS lo,  -- the lowest value, the lowest seq among equals
               max(ARRAY[value, -seq]) AS hi  -- the highest value (NaN highest), the lowest seq among equals
        FROM new_points GROUP BY job_id, name, rank, seq >> 12
    )
    INSERT INTO metric_blocks AS b (job_id, name, rank, block, n, stepped, min_step, max_step,
                                    lo_value, lo_seq, lo_step, lo_ts, hi_value, hi_seq, hi_step, hi_ts)
    SELECT g.job_id, g.name, g.rank, g.block, g.n, g.stepped, g.min_step, g.max_step,
           g.lo[1], g.lo[2]::bigint, lo.step, lo.ts, g.hi[1], (-g.hi[2])::bigint, hi.step, hi.ts
    FROM summary g
    CROSS JOIN LATERAL (SELECT step, ts FROM new_points p WHERE p.seq = g.lo[2]::bigint) AS lo
    CROSS JOIN LATERAL (SELECT step, ts FROM new_points p WHERE p.seq = (-g.hi[2])::bigint) AS hi
    {merge};
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute(_faster())


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute(str(_scale_revision().METRIC_BLOCKS).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
