"""Queries for jobs, their attempts and events."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, String, cast, select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from api.db.direct import Direct, pyformat
from api.db.models import Job, JobEvent, Project
from trainmaster.models import JobStatus


def _with_relations(query: Select[Any]) -> Select[Any]:
    return query.options(selectinload(Job.attempts))


# A queue is a cluster's (each cluster admits its own jobs, api/dispatcher/): the projects on the cluster
# of `{project}`, which every statement below counts ahead of a job. Projects are few: a small scan.
SAME_CLUSTER = """
    SELECT sc.id FROM projects sc
    WHERE sc.cluster_id = (SELECT own.cluster_id FROM projects own WHERE own.id = {project})
"""


# One statement for a new job: the row, its first event, the NOTIFY (sent at commit) and its place in the
# queue; no row when the project already holds a job with this idempotency key. The new job is the
# newest of its class (see QUEUE_POSITIONS below), so every queued job of the groups ahead of it or tied
# with it is ahead: the maintained counts say how many, without reading the queue.
INSERT_QUEUED = text(
    """
    WITH job AS (
        INSERT INTO jobs (id, project_id, name, status, spec, labels, priority, gang_cpus, gang_gpus,
                          idempotency_key, request_hash, pending_reason, user_name)
        VALUES (:id, :project_id, :name, 'queued', CAST(:spec AS jsonb), CAST(:labels AS jsonb), :priority,
                :gang_cpus, :gang_gpus, :idempotency_key, :request_hash, :pending_reason, :user_name)
        ON CONFLICT (project_id, idempotency_key) DO NOTHING
        RETURNING id, created_at, spec
    ),
    event AS (
        INSERT INTO job_events (job_id, kind, status, message, data)
        SELECT id, 'status', 'queued', 'submitted', '{{}}'::jsonb FROM job
    ),
    mine AS (
        SELECT coalesce(min(share), 0) AS share FROM project_usage WHERE project_id = :project_id
    )
    SELECT id, created_at, spec, pg_notify(:channel, :payload),
           1 + coalesce((
               SELECT sum(q.queued) FROM queue_counts q LEFT JOIN project_usage u ON u.project_id = q.project_id
               WHERE (q.priority > :priority
                      OR (q.priority = :priority
                          AND coalesce(u.share, 0) <= mine.share))
                 AND q.project_id IN ({same_cluster})
           ), 0) AS queue_position
    FROM job, mine
    """.format(same_cluster=SAME_CLUSTER.format(project=":project_id"))
)
INSERT_QUEUED_DIRECT = pyformat(INSERT_QUEUED)


async def insert_queued(session: AsyncSession, values: dict[str, Any], channel: str, payload: str) -> Any | None:
    """Insert a queued job with its `submitted` event and notify `channel`; its (id, created_at, spec as
    stored: JSONB orders keys its own way, and every later read answers in that order, queue position),
    or None when the project already holds a job with this idempotency key (nothing is written then)."""
    result = await session.execute(INSERT_QUEUED, {**values, "channel": channel, "payload": payload})
    return result.first()


async def insert_queued_direct(direct: Direct, values: dict[str, Any], channel: str, payload: str) -> Any | None:
    """`insert_queued` as its own transaction on a direct connection (the statement commits as a whole)."""
    return await direct.one(INSERT_QUEUED_DIRECT, {**values, "channel": channel, "payload": payload})


IDEMPOTENT_MATCH = "SELECT id, request_hash FROM jobs WHERE project_id = %(project)s AND idempotency_key = %(key)s"


async def idempotent_match(direct: Direct, project_id: uuid.UUID, key: str) -> tuple[Any, ...] | None:
    """(id, request hash) of the project's job submitted with this idempotency key."""
    return await direct.one(IDEMPOTENT_MATCH, {"project": project_id, "key": key})


async def find_by_idempotency_key(session: AsyncSession, project_id: uuid.UUID, key: str) -> Job | None:
    query = _with_relations(select(Job).where(Job.project_id == project_id, Job.idempotency_key == key))
    return (await session.execute(query)).scalar_one_or_none()


async def get_job(
    session: AsyncSession, job_id: uuid.UUID, project_id: uuid.UUID | None = None, *, for_update: bool = False
) -> Job | None:
    query = _with_relations(select(Job).where(Job.id == job_id))
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    if for_update:
        query = query.with_for_update(of=Job)
    return (await session.execute(query.execution_options(populate_existing=True))).scalar_one_or_none()


async def list_jobs(
    session: AsyncSession,
    project_id: uuid.UUID,
    *,
    statuses: Sequence[JobStatus],
    labels: dict[str, str],
    limit: int,
    after: tuple[datetime, uuid.UUID] | None,
    id_prefix: str | None = None,
) -> list[Job]:
    query = _with_relations(select(Job).where(Job.project_id == project_id))
    if id_prefix:
        query = query.where(cast(Job.id, String).startswith(id_prefix, autoescape=True))
    if statuses:
        query = query.where(Job.status.in_(statuses))
    if labels:
        query = query.where(Job.labels.contains(labels))
    if after is not None:
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(*after))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    return list((await session.execute(query)).scalars())


ACTIVE = (JobStatus.starting, JobStatus.running, JobStatus.cancelling)


def _older_in_group(group: str, created_at: str, job_id: str) -> str:
    """SQL (one row, one column `n`): how many queued jobs of the project and priority of `group` (a
    row with `project_id` and `priority`) come before (`created_at`, `job_id`) in age order, counted
    from the nearer end on ix_jobs_queued_by_project. With fewer than :newer_cap of them at or after
    it (a recent job, the usual case) those are counted and taken from the group's maintained count
    (`queue_counts`); otherwise the older ones are counted. QUEUE_POSITIONS and READ_JOB share it."""
    same_group = f"o.status = 'queued' AND o.project_id = {group}.project_id AND o.priority = {group}.priority"
    return f"""
        SELECT CASE
            WHEN newer.n < :newer_cap THEN (
                SELECT coalesce(sum(q.queued), 0) FROM queue_counts q
                WHERE q.project_id = {group}.project_id AND q.priority = {group}.priority
            ) - newer.n
            ELSE (
                SELECT count(*) FROM jobs o
                WHERE {same_group} AND (o.created_at, o.id) < ({created_at}, {job_id})
            ) END AS n
        FROM (
            SELECT count(*) AS n FROM (
                SELECT FROM jobs o
                WHERE {same_group} AND (o.created_at, o.id) >= ({created_at}, {job_id})
                LIMIT :newer_cap
            ) capped
        ) newer
    """


# The admission order: priority (high first), then fair share (the project with the smallest dominant
# share, `project_usage.share`: its share of the cluster averaged with a half-life plus what its active
# jobs hold now; migration 0020), then age. The dispatcher's claim (api/dispatcher/repository.py,
# `lock_queued`) takes jobs in this order, so the position a user sees is the order admission takes.
# The jobs ahead of each one in that order, without reading the whole queue: whole
# (priority, project) groups ahead (higher priority, or the same priority and a smaller share) come from
# `queue_counts`; only projects with the same priority and exactly the same share interleave by age.
# Those tied jobs older than the page's oldest asked-for job of a class are counted on
# ix_jobs_queued_by_project (an index-only count per tied project, no sort), from whichever end is
# nearer: when fewer than NEWER_CAP of the project's queued jobs are at or after that job (a first
# page, the usual one), they are counted and taken from the project's maintained count instead of
# counting every older job; otherwise the older ones are counted. Only the tied jobs from
# that oldest to the newest asked-for job are read and numbered in age order, once for the whole page.
# A job is tied with its own project's older jobs at its priority (always) and with other projects'
# only while their share equals its project's (e.g. both never used anything).
# The page's jobs are found by their ids joined from the array (a primary-key probe each): with
# `id = ANY(:ids) AND status = 'queued'` the planner read every queued job's entry of ix_jobs_status
# into a BitmapAnd (2.7 ms at 10,000 queued).
QUEUE_POSITIONS = text(
    """
    WITH me AS (
        SELECT j.id, j.priority, j.project_id, j.created_at,
               coalesce(u.share, 0) AS share
        FROM unnest(CAST(:ids AS uuid[])) AS asked(id)
        JOIN jobs j ON j.id = asked.id
        LEFT JOIN project_usage u ON u.project_id = j.project_id
        WHERE j.status = 'queued'
    ),
    groups AS (
        SELECT q.priority, q.project_id, sum(q.queued) AS queued,
               coalesce(min(u.share), 0) AS share
        FROM queue_counts q LEFT JOIN project_usage u ON u.project_id = q.project_id
        WHERE q.project_id IN ({same_cluster})
        GROUP BY q.priority, q.project_id
        HAVING sum(q.queued) > 0
    ),
    newest AS (
        SELECT DISTINCT ON (priority, share) priority, share, created_at, id
        FROM me ORDER BY priority, share, created_at DESC, id DESC
    ),
    oldest AS (
        SELECT DISTINCT ON (priority, share) priority, share, created_at, id
        FROM me ORDER BY priority, share, created_at, id
    ),
    classes AS (
        SELECT n.priority, n.share, n.created_at, n.id, o.created_at AS oldest_at, o.id AS oldest_id
        FROM newest n JOIN oldest o USING (priority, share)
    ),
    tied AS (
        SELECT c.*, g.project_id
        FROM classes c JOIN groups g ON g.priority = c.priority AND g.share = c.share
        UNION
        SELECT c.*, me.project_id
        FROM classes c JOIN me ON me.priority = c.priority AND me.share = c.share
    ),
    older AS (
        SELECT tied.priority, tied.share, sum(c.n) AS n
        FROM tied CROSS JOIN LATERAL ({older_than_oldest}) c
        GROUP BY tied.priority, tied.share
    ),
    numbered AS (
        SELECT t.id, row_number() OVER (
                   PARTITION BY tied.priority, tied.share ORDER BY t.created_at, t.id) - 1 AS ahead
        FROM tied CROSS JOIN LATERAL (
            SELECT j.id, j.created_at FROM jobs j
            WHERE j.status = 'queued' AND j.project_id = tied.project_id AND j.priority = tied.priority
              AND (j.created_at, j.id) >= (tied.oldest_at, tied.oldest_id)
              AND (j.created_at, j.id) <= (tied.created_at, tied.id)
        ) t
    )
    SELECT me.id,
        1 + coalesce((
            SELECT sum(g.queued) FROM groups g
            WHERE g.priority > me.priority
               OR (g.priority = me.priority AND g.share < me.share)
        ), 0) + older.n + numbered.ahead AS position
    FROM me JOIN numbered ON numbered.id = me.id
    JOIN older ON older.priority = me.priority AND older.share = me.share
    """.format(
        older_than_oldest=_older_in_group("tied", "tied.oldest_at", "tied.oldest_id"),
        same_cluster=SAME_CLUSTER.format(project="(SELECT project_id FROM me LIMIT 1)"),
    )
)


async def queue_positions(session: AsyncSession, jobs: Sequence[Job]) -> dict[uuid.UUID, int]:
    """1-based place in the queue for each queued job, in admission order (see QUEUE_POSITIONS)."""
    return await queue_positions_of(session, [job.id for job in jobs if job.status is JobStatus.queued])


NEWER_CAP = 1000


async def queue_positions_of(
    session: AsyncSession, queued_ids: Sequence[uuid.UUID], *, newer_cap: int = NEWER_CAP
) -> dict[uuid.UUID, int]:
    if not queued_ids:
        return {}
    rows = await session.execute(QUEUE_POSITIONS, {"ids": list(queued_ids), "newer_cap": newer_cap})
    return {job_id: int(position) for job_id, position in rows.all()}


# One job as GET /v1/jobs/{id} answers it, in one statement: its row, its attempts (as JSON, in order)
# and, while queued, its queue position. That is QUEUE_POSITIONS for a page of one job, where no other
# job of the page is numbered beside it: the queued jobs of the groups ahead, from the maintained counts,
# and the tied jobs older than it, counted on ix_jobs_queued_by_project. The count of its own project's
# older jobs ("older") is not made when the caller passes it (api/jobs/ranks.py keeps it per process):
# COALESCE evaluates the subquery only when the parameter is NULL, and it counts from the nearer end
# with QUEUE_POSITIONS' own subquery (`_older_in_group`): a job with fewer than `newer_cap` of its
# group at or after it (a job just submitted, polled by its `wait()`) takes the group's maintained
# count less those, so the newest job of a deep queue no longer counts every job ahead of it. The row
# ends with that count, the job's priority and created_at in µs (its place in the group, as the
# tm_queue notices give it).
# The job is found by its primary key alone (OFFSET 0 keeps the planner from folding the project and
# status in): the generic plan these connections use (api/db/direct.py), made while the statistics
# still described an empty queue, otherwise walked the project's whole queue index for it (168 buffers
# at 20,000 queued).
READ_JOB = text(
    """
    WITH me AS (
        SELECT j.priority, j.project_id, j.created_at, j.id,
               coalesce(u.share, 0) AS share
        FROM (SELECT * FROM jobs WHERE id = :id OFFSET 0) j
        LEFT JOIN project_usage u ON u.project_id = j.project_id
        WHERE j.project_id = :project_id AND j.status = 'queued'
    ),
    groups AS (
        SELECT q.priority, q.project_id, sum(q.queued) AS queued,
               coalesce(min(u.share), 0) AS share
        FROM queue_counts q LEFT JOIN project_usage u ON u.project_id = q.project_id
        WHERE q.priority >= (SELECT priority FROM me) AND q.project_id IN ({same_cluster})
        GROUP BY q.priority, q.project_id
        HAVING sum(q.queued) > 0
    ),
    others AS (
        SELECT g.project_id FROM groups g, me
        WHERE g.priority = me.priority AND g.share = me.share AND g.project_id <> me.project_id
    ),
    own AS MATERIALIZED (
        SELECT coalesce(CAST(:older AS bigint), ({older_than_me})) AS older
        FROM me
    ),
    place AS (
        SELECT 1 + coalesce((
                   SELECT sum(g.queued) FROM groups g
                   WHERE g.priority > me.priority
                      OR (g.priority = me.priority AND g.share < me.share)
               ), 0) + own.older + (
                   SELECT count(*) FROM others CROSS JOIN LATERAL (
                       SELECT 1 FROM jobs o
                       WHERE o.status = 'queued' AND o.project_id = others.project_id AND o.priority = me.priority
                         AND (o.created_at, o.id) < (me.created_at, me.id)
                   ) older
               ) AS position,
               own.older
        FROM me, own
    )
    SELECT j.id, j.name, j.status, j.spec, j.created_at, j.started_at, j.finished_at, j.pending_reason,
           j.error, j.latest_metrics,
           coalesce((SELECT json_agg(json_build_object(
                         'n', a.n, 'ray_submission_id', a.ray_submission_id, 'status', a.status,
                         'started_at', a.started_at, 'finished_at', a.finished_at, 'error', a.error,
                         'admitted_at', a.created_at, 'running_at', a.running_at, 'queue_s', a.queue_s,
                         'starting_s', a.starting_s, 'productive_s', a.productive_s, 'lost_s', a.lost_s
                     ) ORDER BY a.n) FROM job_attempts a WHERE a.job_id = j.id), '[]') AS attempts,
           place.position AS queue_position, place.older, j.priority,
           (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_us
    FROM jobs j LEFT JOIN place ON true
    WHERE j.id = :id AND j.project_id = :project_id
    """.format(
        older_than_me=_older_in_group("me", "me.created_at", "me.id"),
        same_cluster=SAME_CLUSTER.format(project=":project_id"),
    )
)


READ_JOB_DIRECT = pyformat(READ_JOB)


async def read_job(
    direct: Direct, job_id: uuid.UUID, project_id: uuid.UUID, older: int | None = None, *, newer_cap: int = NEWER_CAP
) -> tuple[Any, ...] | None:
    """The row READ_JOB reads (its columns in that order), or None when the project holds no such job.
    `older`: the job's count of its own project's older queued jobs, when known (see READ_JOB)."""
    params = {"id": job_id, "project_id": project_id, "older": older, "newer_cap": newer_cap}
    return await direct.one(READ_JOB_DIRECT, params)


# Every queued job of one project and priority in queue order, numbered from 0: what api/jobs/ranks.py
# keeps of a group it has nothing of (one index scan of ix_jobs_queued_by_project instead of a count per
# job polled). The oldest `limit` only: the counts of a queue's head are exact on their own.
GROUP_RANKS = """
    SELECT (extract(epoch FROM created_at) * 1000000)::bigint, id::text,
           row_number() OVER (ORDER BY created_at, id) - 1
    FROM jobs
    WHERE status = 'queued' AND project_id = %(project_id)s AND priority = %(priority)s
    ORDER BY created_at, id
    LIMIT %(limit)s
"""


async def group_ranks(direct: Direct, project_id: uuid.UUID, priority: int, limit: int) -> list[tuple[int, str, int]]:
    """(created µs, id, queued jobs of the group ahead of it) for the oldest `limit` queued jobs of a group."""
    rows = await direct.all(GROUP_RANKS, {"project_id": project_id, "priority": priority, "limit": limit})
    return [(int(created_us), job_id, int(older)) for created_us, job_id, older in rows]


async def list_events(session: AsyncSession, job_id: uuid.UUID) -> list[JobEvent]:
    query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
    return list((await session.execute(query)).scalars())


async def project_name_and_max_priority(session: AsyncSession, project_id: uuid.UUID) -> tuple[str, int]:
    query = select(Project.name, Project.max_priority).where(Project.id == project_id)
    name, max_priority = (await session.execute(query)).one()
    return name, max_priority
