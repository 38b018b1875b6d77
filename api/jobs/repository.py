"""Queries for jobs, their attempts and events."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from api.db.direct import Direct, pyformat
from api.db.models import Job, Project
from api.jobs.ranks import Older
from trainmaster.models import JobStatus


def with_relations(query: Select[Any]) -> Select[Any]:
    return query.options(selectinload(Job.attempts))


# A queue is a cluster's (each cluster admits its own jobs, api/dispatcher/): the projects on the cluster
# of `{project}`, which every statement below counts ahead of a job. Projects are few: a small scan.
SAME_CLUSTER = """
    SELECT sc.id FROM projects sc
    WHERE sc.cluster_id = (SELECT own.cluster_id FROM projects own WHERE own.id = {project})
"""


# A project's capacity, for its share: the one its own last fair-share sample read, or before its first
# the cluster's (the largest any of `{projects}` read; samples of one cluster read the same totals).
CLUSTER_CAPACITY = """
    SELECT max(cpu_capacity) AS cap_cpus, max(gpu_capacity) AS cap_gpus
    FROM project_usage WHERE project_id IN ({projects})
"""


def gang_millis(gang: str) -> str:
    """SQL: a gang's CPUs or GPUs (`gang`, float8) in whole thousandths: what every running sum of the queue
    adds, as the counters trigger does (migration 0026). Integers, so sums are exact in any order."""
    return f"CAST(round({gang} * 1000) AS integer)"


def standing(usage: str, capacity: str) -> str:
    """SQL (a select list): what a project's share is made of, computed once per project: its history,
    what it holds in millis, and its capacity in millis, from its `project_usage` row `usage` (NULL: none,
    it holds nothing and has no history) and `capacity` (a CLUSTER_CAPACITY row)."""
    return f"""coalesce({usage}.history_cpus, 0) AS history_cpus, coalesce({usage}.history_gpus, 0) AS history_gpus,
        CAST(round(coalesce({usage}.cpus, 0) * 1000) AS bigint) AS held_cpu_millis,
        CAST(round(coalesce({usage}.gpus, 0) * 1000) AS bigint) AS held_gpu_millis,
        CAST(coalesce({usage}.cpu_capacity, {capacity}.cap_cpus) * 1000 AS float8) AS cpu_capacity_millis,
        CAST(coalesce({usage}.gpu_capacity, {capacity}.cap_gpus) * 1000 AS float8) AS gpu_capacity_millis"""


def project_share(project: str, cpu_millis_ahead: str, gpu_millis_ahead: str) -> str:
    """SQL: the dominant share (`tm_share`, migration 0026: decide.dominant_share) of the project whose
    `standing` is the row `project`, with `cpu_millis_ahead` and `gpu_millis_ahead` more than it holds:
    what it would hold once the gangs ahead of a job of it are admitted. DRF's progressive filling orders
    the queue by it."""
    return (
        f"tm_share({project}.history_cpus, {project}.history_gpus,"
        f" {project}.held_cpu_millis + {cpu_millis_ahead}, {project}.held_gpu_millis + {gpu_millis_ahead},"
        f" {project}.cpu_capacity_millis, {project}.gpu_capacity_millis)"
    )


# The admission order (decide.admission_key; the dispatcher's claim, api/dispatcher/repository.py QUEUED,
# takes jobs in it, so the position a user sees is the order admission takes): priority (high first),
# then the job's progressive share (`project_share` of its project with the gangs of the project's queued
# jobs ahead of it: higher priority, then older), then age. Along one project's own order that share only
# grows, so a project's jobs keep their (priority, age) order, and the jobs of another project ahead of a
# job are a prefix of that project's queue at its priority.
#
# SPANS (CTEs `counted`, `cap`, `spans`, `bounds`) holds, per (project, priority) group of the cluster at
# or above `{lowest}` priority, from the maintained counts (`queue_counts`, no queue read): its queued jobs
# and their gangs (`queued`, `queued_cpu_millis`, `queued_gpu_millis`), the gangs of the project's groups
# above it (`above_*`), its project's `standing`, and the share of its first job (`first_share`) and a
# bound over its last (`past_share`, with every gang of the group ahead).
SPANS = """
    counted AS (
        SELECT q.priority, q.project_id, sum(q.queued) AS queued,
               CAST(sum(q.cpu_millis) AS bigint) AS queued_cpu_millis,
               CAST(sum(q.gpu_millis) AS bigint) AS queued_gpu_millis
        FROM queue_counts q
        WHERE q.priority >= {lowest} AND q.project_id IN ({same_cluster})
        GROUP BY q.priority, q.project_id
        HAVING sum(q.queued) > 0
    ),
    cap AS ({capacity}),
    spans AS (
        SELECT g.*, {standing}
        FROM (
            SELECT c.*, CAST(coalesce(sum(c.queued_cpu_millis) OVER above, 0) AS bigint) AS above_cpu_millis,
                   CAST(coalesce(sum(c.queued_gpu_millis) OVER above, 0) AS bigint) AS above_gpu_millis
            FROM counted c
            WINDOW above AS (PARTITION BY c.project_id ORDER BY c.priority DESC
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
        ) g
        LEFT JOIN project_usage u ON u.project_id = g.project_id
        CROSS JOIN cap
    ),
    bounds AS MATERIALIZED (  -- its columns read as values on every row a straddling read scans
        SELECT s.*, {first} AS first_share, {past} AS past_share FROM spans s
    )
"""


def spans(lowest: str, project: str) -> str:
    """SPANS for the cluster of `project` (SQL: a project id), its groups at or above priority `lowest`."""
    same_cluster = SAME_CLUSTER.format(project=project)
    return SPANS.format(
        lowest=lowest,
        same_cluster=same_cluster,
        capacity=CLUSTER_CAPACITY.format(projects=same_cluster),
        standing=standing("u", "cap"),
        first=project_share("s", "s.above_cpu_millis", "s.above_gpu_millis"),
        past=project_share("s", "s.above_cpu_millis + s.queued_cpu_millis", "s.above_gpu_millis + s.queued_gpu_millis"),
    )


def _ahead_in(group: str, share: str, created_at: str, job_id: str) -> str:
    """SQL (a number): how many queued jobs of the group `group` (a `bounds` row of another project, at
    the job's priority) come before a job of progressive share `share`, submitted at (`created_at`,
    `job_id`). None when its first job's share is above, all when even its last's would be below, from
    the maintained counts. Otherwise the group is read in its order with its running gang sums (an
    index-only scan of ix_jobs_queued_by_project) up to its first job that does not come before: those
    before it are a prefix, so the read stops there, and it reads no more of the group than is ahead."""
    theirs = project_share(
        group, f"{group}.above_cpu_millis + k.cpu_millis_before", f"{group}.above_gpu_millis + k.gpu_millis_before"
    )
    cpus, gpus = gang_millis("o.gang_cpus"), gang_millis("o.gang_gpus")
    return f"""CASE
        WHEN {group}.past_share < {share} THEN {group}.queued
        WHEN {group}.first_share > {share} THEN 0
        ELSE coalesce((
            SELECT k.ahead FROM (
                SELECT o.created_at, o.id, row_number() OVER age - 1 AS ahead,
                       sum({cpus}) OVER age - {cpus} AS cpu_millis_before,
                       sum({gpus}) OVER age - {gpus} AS gpu_millis_before
                FROM jobs o
                WHERE o.status = 'queued' AND o.project_id = {group}.project_id AND o.priority = {group}.priority
                WINDOW age AS (ORDER BY o.created_at, o.id ROWS UNBOUNDED PRECEDING)
            ) k
            WHERE ({theirs}, k.created_at, k.id) >= ({share}, {created_at}, {job_id})
            ORDER BY k.created_at, k.id
            LIMIT 1
        ), {group}.queued) END"""


def _position(placed: str) -> str:
    """SQL (a number): the 1-based queue position of `placed` (a row with the job's `project_id`,
    `priority`, `created_at`, `id`, `older`: its own group's queued jobs before it, and `share`, its
    progressive share): every queued job of a higher priority, its own group's older jobs, and of each
    other project's group at its priority the jobs before it (`_ahead_in`)."""
    ahead = _ahead_in("b", f"{placed}.share", f"{placed}.created_at", f"{placed}.id")
    return f"""1 + {placed}.older + coalesce((
            SELECT sum(CASE WHEN b.priority > {placed}.priority THEN b.queued ELSE {ahead} END) FROM bounds b
            WHERE b.priority > {placed}.priority
               OR (b.priority = {placed}.priority AND b.project_id <> {placed}.project_id)
        ), 0)"""


# One statement for a new job: the row, its first event, the NOTIFY (sent at commit) and its place in the
# queue; no row when the project already holds a job with this idempotency key. The new job is the
# newest of its group (placed after every job of it: `mine`), so every queued job of its project at or
# above its priority is ahead of it (their gangs too: its share), and of each other project's group at its
# priority the jobs whose share is at most its own: `_position` over SPANS, which reads no queue unless a
# group's shares straddle its share.
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
    {spans},
    own AS (
        SELECT coalesce(sum(b.queued) FILTER (WHERE b.priority = :priority), 0) AS older,
               CAST(coalesce(sum(b.queued_cpu_millis), 0) AS bigint) AS cpus,
               CAST(coalesce(sum(b.queued_gpu_millis), 0) AS bigint) AS gpus
        FROM counted b WHERE b.project_id = :project_id
    ),
    mine AS (  -- the new job as `_position` reads one, after every job of its group
        SELECT CAST(:project_id AS uuid) AS project_id, CAST(:priority AS smallint) AS priority,
               CAST('infinity' AS timestamptz) AS created_at,
               CAST('ffffffff-ffff-ffff-ffff-ffffffffffff' AS uuid) AS id, own.older, {share} AS share
        FROM own CROSS JOIN (
            SELECT {standing} FROM cap LEFT JOIN project_usage u ON u.project_id = :project_id
        ) st
    )
    SELECT job.id, job.created_at, job.spec, pg_notify(:channel, :payload), {position} AS queue_position
    FROM job, mine
    """.format(
        spans=spans(":priority", ":project_id"),
        standing=standing("u", "cap"),
        share=project_share("st", "own.cpus", "own.gpus"),
        position=_position("mine"),
    )
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
    query = with_relations(select(Job).where(Job.project_id == project_id, Job.idempotency_key == key))
    return (await session.execute(query)).scalar_one_or_none()


async def get_job(
    session: AsyncSession, job_id: uuid.UUID, project_id: uuid.UUID | None = None, *, for_update: bool = False
) -> Job | None:
    query = with_relations(select(Job).where(Job.id == job_id))
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    if for_update:
        query = query.with_for_update(of=Job)
    return (await session.execute(query.execution_options(populate_existing=True))).scalar_one_or_none()


ACTIVE = (JobStatus.starting, JobStatus.running, JobStatus.cancelling)


def _older_in_group(group: str, created_at: str, job_id: str) -> str:
    """SQL (one row: `n`, `cpus`, `gpus`): how many queued jobs of the project and priority of `group` (a
    row with `project_id` and `priority`) come before (`created_at`, `job_id`) in age order, and their
    gangs, counted from the nearer end on ix_jobs_queued_by_project (gangs included: index-only). With
    fewer than :newer_cap of them at or after it (a recent job, the usual case) those are counted and
    taken from the group's maintained counts (`queue_counts`); otherwise the older ones are counted."""
    same_group = f"o.status = 'queued' AND o.project_id = {group}.project_id AND o.priority = {group}.priority"
    gangs = f"count(*) AS n, CAST(coalesce(sum({gang_millis('o.gang_cpus')}), 0) AS bigint) AS cpus,"
    gangs += f" CAST(coalesce(sum({gang_millis('o.gang_gpus')}), 0) AS bigint) AS gpus"
    return f"""
        SELECT CASE WHEN newer.n < :newer_cap THEN total.n - newer.n ELSE counted.n END AS n,
               CASE WHEN newer.n < :newer_cap THEN total.cpus - newer.cpus ELSE counted.cpus END AS cpus,
               CASE WHEN newer.n < :newer_cap THEN total.gpus - newer.gpus ELSE counted.gpus END AS gpus
        FROM (
            SELECT {gangs} FROM (
                SELECT o.gang_cpus, o.gang_gpus FROM jobs o
                WHERE {same_group} AND (o.created_at, o.id) >= ({created_at}, {job_id})
                LIMIT :newer_cap
            ) o
        ) newer
        CROSS JOIN (
            SELECT coalesce(sum(q.queued), 0) AS n, CAST(coalesce(sum(q.cpu_millis), 0) AS bigint) AS cpus,
                   CAST(coalesce(sum(q.gpu_millis), 0) AS bigint) AS gpus
            FROM queue_counts q WHERE q.project_id = {group}.project_id AND q.priority = {group}.priority
        ) total
        LEFT JOIN LATERAL (
            SELECT {gangs} FROM jobs o
            WHERE {same_group} AND (o.created_at, o.id) < ({created_at}, {job_id}) AND newer.n >= :newer_cap
        ) counted ON true
    """


# The positions of a page of queued jobs (QUEUE_POSITIONS), in one statement. Per (project, priority) group
# of the page, the group's jobs older than its oldest asked-for job are counted with their gangs once
# (`_older_in_group`, from the nearer end), and only the group's jobs from that oldest to its newest
# asked-for job are read and numbered in age order with their running gang sums: each job's own older
# jobs and the gangs ahead of it in its project, hence its share, then its place (`_position`).
# The page's jobs are found by their ids joined from the array (a primary-key probe each): with
# `id = ANY(:ids) AND status = 'queued'` the planner read every queued job's entry of ix_jobs_status
# into a BitmapAnd (2.7 ms at 10,000 queued).
QUEUE_POSITIONS = text(
    """
    WITH me AS (
        SELECT j.id, j.priority, j.project_id, j.created_at
        FROM unnest(CAST(:ids AS uuid[])) AS asked(id)
        JOIN jobs j ON j.id = asked.id
        WHERE j.status = 'queued'
    ),
    {spans},
    oldest AS (
        SELECT DISTINCT ON (project_id, priority) project_id, priority, created_at, id
        FROM me ORDER BY project_id, priority, created_at, id
    ),
    newest AS (
        SELECT DISTINCT ON (project_id, priority) project_id, priority, created_at, id
        FROM me ORDER BY project_id, priority, created_at DESC, id DESC
    ),
    numbered AS (
        SELECT t.id, c.n + t.older AS older, c.cpus + t.cpus_before AS cpus, c.gpus + t.gpus_before AS gpus
        FROM oldest f JOIN newest n USING (project_id, priority)
        CROSS JOIN LATERAL ({older_than_oldest}) c
        CROSS JOIN LATERAL (
            SELECT j.id, row_number() OVER age - 1 AS older,
                   sum({cpus}) OVER age - {cpus} AS cpus_before, sum({gpus}) OVER age - {gpus} AS gpus_before
            FROM jobs j
            WHERE j.status = 'queued' AND j.project_id = f.project_id AND j.priority = f.priority
              AND (j.created_at, j.id) >= (f.created_at, f.id) AND (j.created_at, j.id) <= (n.created_at, n.id)
            WINDOW age AS (ORDER BY j.created_at, j.id ROWS UNBOUNDED PRECEDING)
        ) t
    ),
    placed AS (
        SELECT me.*, nb.older, {share} AS share
        FROM me JOIN numbered nb ON nb.id = me.id
        JOIN bounds s ON s.project_id = me.project_id AND s.priority = me.priority
    )
    SELECT p.id, {position} AS position FROM placed p
    """.format(
        spans=spans("(SELECT min(priority) FROM me)", "(SELECT project_id FROM me LIMIT 1)"),
        older_than_oldest=_older_in_group("f", "f.created_at", "f.id"),
        share=project_share("s", "s.above_cpu_millis + nb.cpus", "s.above_gpu_millis + nb.gpus"),
        cpus=gang_millis("j.gang_cpus"),
        gpus=gang_millis("j.gang_gpus"),
        position=_position("p"),
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
# and, while queued, its queue position: QUEUE_POSITIONS for a page of one job. Its own group's older
# jobs and their gangs ("older") are not counted when the caller passes them (api/jobs/ranks.py keeps
# them per process): the union's branch that counts runs only when the parameter is NULL, and it counts
# from the nearer end (`_older_in_group`): a job with fewer than `newer_cap` of its group at or after it
# (a job just submitted, polled by its `wait()`) takes the group's maintained counts less those, so the
# newest job of a deep queue no longer counts every job ahead of it. The row ends with that count and
# those gangs, the job's priority and created_at in µs (its place in the group, as the tm_queue notices
# give it).
# The job is found by its primary key alone (OFFSET 0 keeps the planner from folding the project and
# status in): the generic plan these connections use (api/db/direct.py), made while the statistics
# still described an empty queue, otherwise walked the project's whole queue index for it (168 buffers
# at 20,000 queued).
READ_JOB = text(
    """
    WITH me AS (
        SELECT j.priority, j.project_id, j.created_at, j.id
        FROM (SELECT * FROM jobs WHERE id = :id OFFSET 0) j
        WHERE j.project_id = :project_id AND j.status = 'queued'
    ),
    {spans},
    own AS MATERIALIZED (
        SELECT CAST(:older AS bigint) AS n, CAST(:older_cpus AS bigint) AS cpus, CAST(:older_gpus AS bigint) AS gpus
        FROM me WHERE CAST(:older AS bigint) IS NOT NULL
        UNION ALL
        SELECT c.n, c.cpus, c.gpus FROM me CROSS JOIN LATERAL ({older_than_me}) c
        WHERE CAST(:older AS bigint) IS NULL
    ),
    placed AS (
        SELECT me.*, own.n AS older, own.cpus AS older_cpus, own.gpus AS older_gpus, {share} AS share
        FROM me CROSS JOIN own
        JOIN bounds s ON s.project_id = me.project_id AND s.priority = me.priority
    ),
    place AS (
        SELECT {position} AS position, p.older, p.older_cpus, p.older_gpus FROM placed p
    )
    SELECT j.id, j.name, j.status, j.spec, j.created_at, j.started_at, j.finished_at, j.pending_reason,
           j.error, j.latest_metrics,
           coalesce((SELECT json_agg(json_build_object(
                         'n', a.n, 'ray_submission_id', a.ray_submission_id, 'status', a.status,
                         'started_at', a.started_at, 'finished_at', a.finished_at, 'error', a.error,
                         'admitted_at', a.created_at, 'running_at', a.running_at, 'queue_s', a.queue_s,
                         'starting_s', a.starting_s, 'productive_s', a.productive_s, 'lost_s', a.lost_s
                     ) ORDER BY a.n) FROM job_attempts a WHERE a.job_id = j.id), '[]') AS attempts,
           place.position AS queue_position, place.older, place.older_cpus, place.older_gpus, j.priority,
           (extract(epoch FROM j.created_at) * 1000000)::bigint AS created_us
    FROM jobs j LEFT JOIN place ON true
    WHERE j.id = :id AND j.project_id = :project_id
    """.format(
        spans=spans("(SELECT priority FROM me)", ":project_id"),
        older_than_me=_older_in_group("me", "me.created_at", "me.id"),
        share=project_share("s", "s.above_cpu_millis + own.cpus", "s.above_gpu_millis + own.gpus"),
        position=_position("p"),
    )
)


READ_JOB_DIRECT = pyformat(READ_JOB)


async def read_job(
    direct: Direct, job_id: uuid.UUID, project_id: uuid.UUID, older: Older | None = None, *, newer_cap: int = NEWER_CAP
) -> tuple[Any, ...] | None:
    """The row READ_JOB reads (its columns in that order), or None when the project holds no such job.
    `older`: the job's own group's older queued jobs and their gangs, when known (see READ_JOB)."""
    count, cpus, gpus = older if older is not None else (None, None, None)
    params = {"id": job_id, "project_id": project_id, "newer_cap": newer_cap}
    params |= {"older": count, "older_cpus": cpus, "older_gpus": gpus}
    return await direct.one(READ_JOB_DIRECT, params)


# Every queued job of one project and priority in queue order, numbered from 0 with the gangs before it:
# what api/jobs/ranks.py keeps of a group it has nothing of (one index-only scan of
# ix_jobs_queued_by_project instead of a count per job polled). The oldest `limit` only: the counts of a
# queue's head are exact on their own.
GROUP_RANKS = """
    SELECT (extract(epoch FROM created_at) * 1000000)::bigint, id::text, row_number() OVER age - 1,
           sum({cpus}) OVER age - {cpus}, sum({gpus}) OVER age - {gpus}
    FROM jobs
    WHERE status = 'queued' AND project_id = %(project_id)s AND priority = %(priority)s
    WINDOW age AS (ORDER BY created_at, id ROWS UNBOUNDED PRECEDING)
    ORDER BY created_at, id
    LIMIT %(limit)s
""".format(cpus=gang_millis("gang_cpus"), gpus=gang_millis("gang_gpus"))


async def group_ranks(direct: Direct, project_id: uuid.UUID, priority: int, limit: int) -> list[tuple[int, str, Older]]:
    """(created µs, id, its Older) for the oldest `limit` queued jobs of a group."""
    rows = await direct.all(GROUP_RANKS, {"project_id": project_id, "priority": priority, "limit": limit})
    return [(int(created_us), job_id, (int(n), int(cpus), int(gpus))) for created_us, job_id, n, cpus, gpus in rows]


async def project_name_and_max_priority(session: AsyncSession, project_id: uuid.UUID) -> tuple[str, int]:
    query = select(Project.name, Project.max_priority).where(Project.id == project_id)
    name, max_priority = (await session.execute(query)).one()
    return name, max_priority
