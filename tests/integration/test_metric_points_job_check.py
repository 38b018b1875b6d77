"""metric_points.job_id keeps a foreign key's guarantees without one (migration 0009): a point names a
job that exists, and goes when its job goes, whichever way the job goes and whichever comes first."""

from __future__ import annotations

import math
import threading
import uuid
from datetime import datetime, timezone

import psycopg
import pytest
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient

from api.db.migrate import alembic_config
from api.settings import libpq_url as libpq
from tests.factories.database import metric_rows
from tests.factories.http import post_losses, submit
from tests.factories.waiting import wait_until

INSERT = "INSERT INTO metric_points (job_id, name, value) VALUES (%s, 'loss', 1.0)"


def count(database_url: str, sql: str, *args: object) -> int:
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute(sql, args).fetchone()
        assert row is not None
        return int(row[0])


def on_a_lock(database_url: str, backend_pid: int) -> bool:
    """Whether that session waits on a lock now."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
    return bool(count(database_url, query, backend_pid))


def test_a_point_for_no_job_is_refused_by_insert_and_copy(database_url: str) -> None:
    ghost = uuid.uuid4()
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match=str(ghost)):
            conn.execute(INSERT, (ghost,))
        with pytest.raises(psycopg.errors.ForeignKeyViolation):  # noqa: SIM117
            with conn.cursor().copy("COPY metric_points (job_id, name, value) FROM STDIN") as copy:
                copy.write_row((ghost, "loss", 1.0))
    assert count(database_url, "SELECT count(*) FROM metric_points") == 0


def test_points_go_with_their_job_its_project_and_a_truncate(http: TestClient, token: str, database_url: str) -> None:
    kept, deleted, by_project = submit(http, token), submit(http, token), submit(http, token)
    for job_id in (kept, deleted, by_project):
        post_losses(http, token, job_id, [1.0, 0.5, 0.25])
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute("DELETE FROM jobs WHERE id = %s", (deleted,))
        assert (metric_rows(database_url, deleted), metric_rows(database_url, kept)) == (0, 3)
        other = conn.execute(
            "INSERT INTO projects (id, name, cluster_id)"
            " SELECT gen_random_uuid(), 'gone', id FROM clusters WHERE name = 'default' RETURNING id"
        ).fetchone()
        assert other is not None
        conn.execute("UPDATE jobs SET project_id = %s WHERE id = %s", (other[0], by_project))
        conn.execute("DELETE FROM projects WHERE id = %s", (other[0],))  # cascades to the job, then its points
        assert (metric_rows(database_url, by_project), metric_rows(database_url, kept)) == (0, 3)
        conn.execute("DELETE FROM jobs")  # every job at once: no point outlives its job
    assert count(database_url, "SELECT count(*) FROM metric_points") == 0


def test_a_job_deleted_while_a_batch_is_written_takes_the_batch_with_it(
    http: TestClient, token: str, database_url: str
) -> None:
    """The writer locks its job (FOR KEY SHARE, as the key's check did): the delete waits for the
    writer's commit, then removes what it committed. No point outlives its job."""
    job_id = submit(http, token)
    now = datetime.now(timezone.utc)
    with psycopg.connect(libpq(database_url)) as writer, psycopg.connect(libpq(database_url)) as deleter:
        writer.execute(INSERT, (job_id,))  # in its transaction, not committed
        deleter.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            deleter.execute("DELETE FROM jobs WHERE id = %s", (job_id,))
        deleter.rollback()
        done = threading.Event()

        def delete() -> None:
            deleter.execute("SET lock_timeout = '30s'")
            deleter.execute("DELETE FROM jobs WHERE id = %s", (job_id,))
            deleter.commit()
            done.set()

        thread = threading.Thread(target=delete)
        thread.start()
        pid = deleter.info.backend_pid
        wait_until(lambda: on_a_lock(database_url, pid), 30, interval=0.02, what="the delete to wait on the writer")
        assert not done.is_set()
        writer.execute("INSERT INTO metric_points (job_id, name, value, ts) VALUES (%s, 'acc', 2.0, %s)", (job_id, now))
        writer.commit()
        thread.join(30)
        assert done.is_set()
    assert metric_rows(database_url, job_id) == 0


def test_a_batch_for_a_job_being_deleted_fails_once_the_delete_commits(
    http: TestClient, token: str, database_url: str
) -> None:
    job_id = submit(http, token)
    with psycopg.connect(libpq(database_url)) as deleter, psycopg.connect(libpq(database_url)) as writer:
        deleter.execute("DELETE FROM jobs WHERE id = %s", (job_id,))  # not committed yet
        failed: list[BaseException] = []

        def write() -> None:
            try:
                writer.execute(INSERT, (job_id,))
            except psycopg.Error as exc:
                failed.append(exc)

        thread = threading.Thread(target=write)
        thread.start()
        pid = writer.info.backend_pid
        wait_until(lambda: on_a_lock(database_url, pid), 30, interval=0.02, what="the writer to wait on the delete")
        assert thread.is_alive()
        deleter.commit()
        thread.join(30)
        assert len(failed) == 1 and isinstance(failed[0], psycopg.errors.ForeignKeyViolation)
    assert count(database_url, "SELECT count(*) FROM metric_points") == 0


def test_blocks_summarise_exactly_what_was_stored(http: TestClient, token: str, database_url: str) -> None:
    """migration 0010's trigger against migration 0005's sorted aggregates run over the stored points:
    several statements into the same blocks, ties, NaN, infinities, negative zero, steps missing."""
    job_id = submit(http, token)
    values = ["1", "1", "'NaN'", "'-Infinity'", "'Infinity'", "0", "'-0'", "-1", "random()", "random() * -1"]
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        for statement in range(12):
            conn.execute(
                "INSERT INTO metric_points (job_id, rank, step, name, value, ts)"
                " SELECT %s, g %% 2, CASE WHEN g %% 5 = 0 THEN NULL ELSE g END, 'm' || (g %% 3),"
                f" (ARRAY[{', '.join(values)}]::float8[])[1 + (g * 7 + %s) %% {len(values)}],"
                " now() + g * interval '1 ms' FROM generate_series(1, %s) AS g",
                (job_id, statement, 700 + statement * 311),
            )
        reference = conn.execute(
            sorted_summary(database_url).format(source="(SELECT * FROM metric_points WHERE job_id = %s) AS p"),
            (job_id,),
        ).fetchall()
        kept = conn.execute(
            "SELECT job_id, name, rank, block, n, stepped, min_step, max_step, lo_value, lo_seq, lo_step, lo_ts,"
            " hi_value, hi_seq, hi_step, hi_ts FROM metric_blocks WHERE job_id = %s ORDER BY name, rank, block",
            (job_id,),
        ).fetchall()
    assert len(kept) > 12 and comparable(kept) == comparable(reference)


def comparable(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """NaN as a string: Python's NaN is not equal to itself."""
    return [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in rows]


def sorted_summary(database_url: str) -> str:
    """Migration 0005's summary of a block, the reference (eight sorts, the obvious way), as a query."""
    revision = ScriptDirectory.from_config(alembic_config(database_url)).get_revision("0005_scale")
    assert revision is not None
    select = "SELECT" + str(revision.module.BLOCKS_FROM).partition("SELECT")[2].partition("ON CONFLICT")[0]
    return select + " ORDER BY name, rank, seq >> 12"
