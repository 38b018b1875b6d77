"""The admission order in SQL: every statement that orders, claims or counts the queue, written once.

`order.py` is the same order in Python. The pieces (`standing`, `project_share`, `spans`, `position`)
are composed into named statements here and nowhere else: the claim a dispatcher's round takes its batch
with (CLAIM), a new job's place (INSERT_QUEUED), a page's places (QUEUE_POSITIONS), one job with its
place (READ_JOB) and a group's ranks for the per-process cache (GROUP_RANKS, ranks.py). Statements use
psycopg's `%(name)s` parameters, passed to the driver as written whichever way they run (a direct
connection or a session's: api/db/direct.py); repository.py runs them."""

from __future__ import annotations

# order.dominant_share in SQL, over whole thousandths of a CPU or GPU ("millis"): `cpu_millis` is what the
# project holds plus the gangs ahead, summed as integers (exact in any order, so two statements summing the
# same gangs compute the same share to the bit), `cpu_capacity_millis` the cluster's (NULL: the resources counted as
# they are). All float8 and bigint: a numeric sum or a
# numeric-to-float8 cast on every row a scan reads cost several times the scan.
TM_SHARE_FUNCTION = """
CREATE OR REPLACE FUNCTION tm_share(
    history_cpus float8, history_gpus float8, cpu_millis bigint, gpu_millis bigint,
    cpu_capacity_millis float8, gpu_capacity_millis float8
) RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(
        history_cpus + CASE WHEN cpu_capacity_millis IS NULL THEN CAST(cpu_millis AS float8) / 1000
                            WHEN cpu_capacity_millis > 0 THEN CAST(cpu_millis AS float8) / cpu_capacity_millis
                            ELSE 0 END,
        history_gpus + CASE WHEN gpu_capacity_millis IS NULL THEN CAST(gpu_millis AS float8) / 1000
                            WHEN gpu_capacity_millis > 0 THEN CAST(gpu_millis AS float8) / gpu_capacity_millis
                            ELSE 0 END)
$$
"""

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
    """SQL: the dominant share (TM_SHARE_FUNCTION: order.dominant_share) of the project whose
    `standing` is the row `project`, with `cpu_millis_ahead` and `gpu_millis_ahead` more than it holds:
    what it would hold once the gangs ahead of a job of it are admitted. DRF's progressive filling orders
    the queue by it."""
    return (
        f"tm_share({project}.history_cpus, {project}.history_gpus,"
        f" {project}.held_cpu_millis + {cpu_millis_ahead}, {project}.held_gpu_millis + {gpu_millis_ahead},"
        f" {project}.cpu_capacity_millis, {project}.gpu_capacity_millis)"
    )


# A project's dominant share over what it holds now, against the capacity its last fair-share sample read
# (none yet: the resources as they are): the stored column `project_usage.share` (api/db/models/usage.py), what
# `GET /v1/queues` shows.
SHARE_COLUMN = (
    "tm_share(history_cpus, history_gpus, CAST(round(cpus * 1000) AS bigint), CAST(round(gpus * 1000) AS bigint),"
    " CAST(cpu_capacity * 1000 AS float8), CAST(gpu_capacity * 1000 AS float8))"
)

# The admission order (order.admission_key; a dispatcher's round claims its batch in it, CLAIM,
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


def ahead_in(group: str, share: str, created_at: str, job_id: str) -> str:
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


def position(placed: str) -> str:
    """SQL (a number): the 1-based queue position of `placed` (a row with the job's `project_id`,
    `priority`, `created_at`, `id`, `older`: its own group's queued jobs before it, and `share`, its
    progressive share): every queued job of a higher priority, its own group's older jobs, and of each
    other project's group at its priority the jobs before it (`ahead_in`)."""
    ahead = ahead_in("b", f"{placed}.share", f"{placed}.created_at", f"{placed}.id")
    return f"""1 + {placed}.older + coalesce((
            SELECT sum(CASE WHEN b.priority > {placed}.priority THEN b.queued ELSE {ahead} END) FROM bounds b
            WHERE b.priority > {placed}.priority
               OR (b.priority = {placed}.priority AND b.project_id <> {placed}.project_id)
        ), 0)"""


# One statement for a new job: the row, its first event, the NOTIFY (sent at commit) and its place in the
# queue; no row when the project already holds a job with this idempotency key. The new job is the
# newest of its group (placed after every job of it: `mine`), so every queued job of its project at or
# above its priority is ahead of it (their gangs too: its share), and of each other project's group at its
# priority the jobs whose share is at most its own: `position` over SPANS, which reads no queue unless a
# group's shares straddle its share.
INSERT_QUEUED = """
    WITH job AS (
        INSERT INTO jobs (id, project_id, name, status, spec, labels, priority, gang_cpus, gang_gpus,
                          idempotency_key, request_hash, pending_reason, user_name)
        VALUES (%(id)s, %(project_id)s, %(name)s, 'queued', CAST(%(spec)s AS jsonb), CAST(%(labels)s AS jsonb),
                %(priority)s, %(gang_cpus)s, %(gang_gpus)s, %(idempotency_key)s, %(request_hash)s,
                %(pending_reason)s, %(user_name)s)
        ON CONFLICT (project_id, idempotency_key) DO NOTHING
        RETURNING id, created_at, spec
    ),
    event AS (
        INSERT INTO job_events (job_id, kind, status, message, data)
        SELECT id, 'status', 'queued', 'submitted', '{{}}'::jsonb FROM job
    ),
    {spans},
    own AS (
        SELECT coalesce(sum(b.queued) FILTER (WHERE b.priority = %(priority)s), 0) AS older,
               CAST(coalesce(sum(b.queued_cpu_millis), 0) AS bigint) AS cpus,
               CAST(coalesce(sum(b.queued_gpu_millis), 0) AS bigint) AS gpus
        FROM counted b WHERE b.project_id = %(project_id)s
    ),
    mine AS (  -- the new job as `position` reads one, after every job of its group
        SELECT CAST(%(project_id)s AS uuid) AS project_id, CAST(%(priority)s AS smallint) AS priority,
               CAST('infinity' AS timestamptz) AS created_at,
               CAST('ffffffff-ffff-ffff-ffff-ffffffffffff' AS uuid) AS id, own.older, {share} AS share
        FROM own CROSS JOIN (
            SELECT {standing} FROM cap LEFT JOIN project_usage u ON u.project_id = %(project_id)s
        ) st
    )
    SELECT job.id, job.created_at, job.spec, pg_notify(%(channel)s, %(payload)s), {position} AS queue_position
    FROM job, mine
    """.format(
    spans=spans("%(priority)s", "%(project_id)s"),
    standing=standing("u", "cap"),
    share=project_share("st", "own.cpus", "own.gpus"),
    position=position("mine"),
)


def older_in_group(group: str, created_at: str, job_id: str) -> str:
    """SQL (one row: `n`, `cpus`, `gpus`): how many queued jobs of the project and priority of `group` (a
    row with `project_id` and `priority`) come before (`created_at`, `job_id`) in age order, and their
    gangs, counted from the nearer end on ix_jobs_queued_by_project (gangs included: index-only). With
    fewer than `newer_cap` of them at or after it (a recent job, the usual case) those are counted and
    taken from the group's maintained counts (`queue_counts`); otherwise the older ones are counted."""
    same_group = f"o.status = 'queued' AND o.project_id = {group}.project_id AND o.priority = {group}.priority"
    gangs = f"count(*) AS n, CAST(coalesce(sum({gang_millis('o.gang_cpus')}), 0) AS bigint) AS cpus,"
    gangs += f" CAST(coalesce(sum({gang_millis('o.gang_gpus')}), 0) AS bigint) AS gpus"
    return f"""
        SELECT CASE WHEN newer.n < %(newer_cap)s THEN total.n - newer.n ELSE counted.n END AS n,
               CASE WHEN newer.n < %(newer_cap)s THEN total.cpus - newer.cpus ELSE counted.cpus END AS cpus,
               CASE WHEN newer.n < %(newer_cap)s THEN total.gpus - newer.gpus ELSE counted.gpus END AS gpus
        FROM (
            SELECT {gangs} FROM (
                SELECT o.gang_cpus, o.gang_gpus FROM jobs o
                WHERE {same_group} AND (o.created_at, o.id) >= ({created_at}, {job_id})
                LIMIT %(newer_cap)s
            ) o
        ) newer
        CROSS JOIN (
            SELECT coalesce(sum(q.queued), 0) AS n, CAST(coalesce(sum(q.cpu_millis), 0) AS bigint) AS cpus,
                   CAST(coalesce(sum(q.gpu_millis), 0) AS bigint) AS gpus
            FROM queue_counts q WHERE q.project_id = {group}.project_id AND q.priority = {group}.priority
        ) total
        LEFT JOIN LATERAL (
            SELECT {gangs} FROM jobs o
            WHERE {same_group} AND (o.created_at, o.id) < ({created_at}, {job_id}) AND newer.n >= %(newer_cap)s
        ) counted ON true
    """


# The positions of a page of queued jobs (QUEUE_POSITIONS), in one statement. Per (project, priority) group
# of the page, the group's jobs older than its oldest asked-for job are counted with their gangs once
# (`older_in_group`, from the nearer end), and only the group's jobs from that oldest to its newest
# asked-for job are read and numbered in age order with their running gang sums: each job's own older
# jobs and the gangs ahead of it in its project, hence its share, then its place (`position`).
# The page's jobs are found by their ids joined from the array (a primary-key probe each): with
# `id = ANY(ids) AND status = 'queued'` the planner read every queued job's entry of ix_jobs_status
# into a BitmapAnd (2.7 ms at 10,000 queued).
QUEUE_POSITIONS = """
    WITH me AS (
        SELECT j.id, j.priority, j.project_id, j.created_at
        FROM unnest(CAST(%(ids)s AS uuid[])) AS asked(id)
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
    older_than_oldest=older_in_group("f", "f.created_at", "f.id"),
    share=project_share("s", "s.above_cpu_millis + nb.cpus", "s.above_gpu_millis + nb.gpus"),
    cpus=gang_millis("j.gang_cpus"),
    gpus=gang_millis("j.gang_gpus"),
    position=position("p"),
)

# One job as GET /v1/jobs/{id} answers it, in one statement: its row, its attempts (as JSON, in order)
# and, while queued, its queue position: QUEUE_POSITIONS for a page of one job. Its own group's older
# jobs and their gangs ("older") are not counted when the caller passes them (ranks.py keeps
# them per process): the union's branch that counts runs only when the parameter is NULL, and it counts
# from the nearer end (`older_in_group`): a job with fewer than `newer_cap` of its group at or after it
# (a job just submitted, polled by its `wait()`) takes the group's maintained counts less those, so the
# newest job of a deep queue no longer counts every job ahead of it. The row ends with that count and
# those gangs, the job's priority and created_at in µs (its place in the group, as the tm_queue notices
# give it).
# The job is found by its primary key alone (OFFSET 0 keeps the planner from folding the project and
# status in): the generic plan these connections use (api/db/direct.py), made while the statistics
# still described an empty queue, otherwise walked the project's whole queue index for it (168 buffers
# at 20,000 queued).
READ_JOB = """
    WITH me AS (
        SELECT j.priority, j.project_id, j.created_at, j.id
        FROM (SELECT * FROM jobs WHERE id = %(id)s OFFSET 0) j
        WHERE j.project_id = %(project_id)s AND j.status = 'queued'
    ),
    {spans},
    own AS MATERIALIZED (
        SELECT CAST(%(older)s AS bigint) AS n, CAST(%(older_cpus)s AS bigint) AS cpus,
               CAST(%(older_gpus)s AS bigint) AS gpus
        FROM me WHERE CAST(%(older)s AS bigint) IS NOT NULL
        UNION ALL
        SELECT c.n, c.cpus, c.gpus FROM me CROSS JOIN LATERAL ({older_than_me}) c
        WHERE CAST(%(older)s AS bigint) IS NULL
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
    WHERE j.id = %(id)s AND j.project_id = %(project_id)s
    """.format(
    spans=spans("(SELECT priority FROM me)", "%(project_id)s"),
    older_than_me=older_in_group("me", "me.created_at", "me.id"),
    share=project_share("s", "s.above_cpu_millis + own.cpus", "s.above_gpu_millis + own.gpus"),
    position=position("p"),
)

# Every queued job of one project and priority in queue order, numbered from 0 with the gangs before it:
# what ranks.py keeps of a group it has nothing of (one index-only scan of
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


# The round's batch in admission order (order.admission_key), DRF's progressive filling: each queued job
# carries its project's share with the gangs of the project's queued jobs before it (higher priority, then
# older) added to what the project holds (`tm_share`; the positions above count the same order). Within a
# project that share only grows along its order, so the project's jobs come in its own (priority, age)
# order and the first `limit` of all are among the first `limit` of each project: those are read per
# project on ix_jobs_queued_by_project, gangs included (an index-only scan, the running sums streamed
# beside it), only those narrow rows are sorted, and only the first `limit` are fetched and locked, so a
# round reads projects x limit index entries and `limit` rows however long the queue is. A project's
# share is of its own cluster's capacity, the one its last fair-share sample read (or any project's of
# the cluster, before its first).
CLAIM = """
    WITH ours AS (
        SELECT id FROM projects WHERE CAST(%(cluster)s AS uuid) IS NULL OR cluster_id = CAST(%(cluster)s AS uuid)
    ),
    cap AS ({capacity}),
    standing AS MATERIALIZED (
        SELECT p.id, {standing}
        FROM ours p
        LEFT JOIN project_usage u ON u.project_id = p.id
        CROSS JOIN cap
        WHERE NOT (p.id = ANY(CAST(%(seen)s AS uuid[])))
    ),
    head AS (
        SELECT f.id, f.priority, f.created_at, {share} AS share
        FROM standing s
        CROSS JOIN LATERAL (
            SELECT q.id, q.priority, q.created_at,
                   sum({cpus}) OVER ahead - {cpus} AS cpu_millis_ahead,
                   sum({gpus}) OVER ahead - {gpus} AS gpu_millis_ahead
            FROM jobs q
            WHERE q.project_id = s.id AND q.status = 'queued'
            WINDOW ahead AS (ORDER BY q.priority DESC, q.created_at, q.id ROWS UNBOUNDED PRECEDING)
            ORDER BY q.priority DESC, q.created_at, q.id
            LIMIT %(limit)s
        ) f
        ORDER BY f.priority DESC, share, f.created_at, f.id
        LIMIT %(limit)s
    )
    SELECT j.id, j.project_id, j.name, j.spec, j.priority, j.gang_cpus, j.gang_gpus, j.pending_reason,
           j.infeasible_since, j.created_at, j.bypassed_since, head.share,
           (SELECT coalesce(max(a.n), 0) FROM job_attempts a WHERE a.job_id = j.id) AS attempts
    FROM jobs j JOIN head ON head.id = j.id
    WHERE j.status = 'queued'
    ORDER BY head.priority DESC, head.share, head.created_at, head.id
    FOR UPDATE OF j SKIP LOCKED
    """.format(
    capacity=CLUSTER_CAPACITY.format(projects="SELECT id FROM ours"),
    standing=standing("u", "cap"),
    share=project_share("s", "f.cpu_millis_ahead", "f.gpu_millis_ahead"),
    cpus=gang_millis("q.gang_cpus"),
    gpus=gang_millis("q.gang_gpus"),
)
