"""What an admission round and its launches write, each in one statement: the round's decisions
(ROUND_WRITES: admitted gangs to starting, failures, waiting jobs' reasons), the launches Ray accepted
(MARK_SUBMITTED) and those it never can (FAIL_LAUNCHES), under the status machine's rules and the
lease's fencing. RELEASED is what every ended attempt clears of its job (ending.release too)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from api.jobs.status import can_transition, sources
from api.queues.repository import QueuedJob
from trainmaster.models import JobStatus

STARTING_SOURCES = sources(JobStatus.starting)  # what ROUND_WRITES may move to starting
FAILED_SOURCES = sources(JobStatus.failed)  # and to failed


# What an admission round decided, in one statement: the admitted gangs (`gangs`) move to starting
# under this dispatcher's lease, but only those whose status may still legally become starting
# (`sources`, from the status machine's table: api/jobs/status.py); each gang that moved, and only
# those, gets its attempt row (pending), job token, events (the round's storage `warning` first, then
# each status change with the status it left) and NOTIFY (sent by PostgreSQL at commit). The jobs the
# round could not place or knows cannot launch (`failures`) fail, each with its error, status event
# and NOTIFY, as `transition` would write them one at a time. The waiting jobs get their new reasons
# (`reasons`), written only where one changed (a round repeats most). The rows come as JSON documents,
# one parameter each. The self-join on `jobs AS old` reads each row as it was before the UPDATE (its
# status left). Returns the ids of the jobs that moved, each with whether it started (else it failed).
ROUND_WRITES = text(
    """
    WITH started AS (
        UPDATE jobs j SET status = 'starting', lease_owner = :owner, lease_expires_at = :lease_expires_at,
                          pending_reason = NULL, infeasible_since = NULL, bypassed_since = NULL
        FROM jsonb_to_recordset(CAST(:gangs AS jsonb))
             AS g(at int, job_id uuid, n int, submission_id text, message text, payload text, selector jsonb),
             jobs old
        WHERE j.id = g.job_id AND old.id = g.job_id AND old.status = ANY(CAST(:sources AS job_status[]))
        RETURNING g.*, old.status AS left_status
    ),
    failed AS (
        UPDATE jobs j SET status = 'failed', error = f.error, finished_at = now(), pending_reason = NULL
        FROM jsonb_to_recordset(CAST(:failures AS jsonb)) AS f(at int, job_id uuid, error text, message text),
             jobs old
        WHERE j.id = f.job_id AND old.id = f.job_id AND old.status = ANY(CAST(:failed_sources AS job_status[]))
        RETURNING f.*, old.status AS left_status
    ),
    attempts AS (
        INSERT INTO job_attempts (job_id, n, ray_submission_id, status, selector)
        SELECT s.job_id, s.n, s.submission_id, 'pending', s.selector FROM started s
    ),
    tokens AS (
        INSERT INTO api_tokens (id, project_id, job_id, token_hash, description, attempt)
        SELECT g.token_id, g.project_id, g.job_id, g.token_hash, 'job', s.n
        FROM jsonb_to_recordset(CAST(:gangs AS jsonb))
             AS g(token_id uuid, project_id uuid, job_id uuid, token_hash text)
        JOIN started s ON s.job_id = g.job_id
    ),
    events AS (
        INSERT INTO job_events (job_id, kind, status, message, data)
        SELECT e.job_id, e.kind, e.status, e.message, e.data
        FROM (
            SELECT 0 AS part, s.at, s.job_id, 'storage_warning' AS kind, NULL::job_status AS status,
                   CAST(:warning AS text) AS message, '{}'::jsonb AS data
            FROM started s WHERE CAST(:warning AS text) IS NOT NULL
            UNION ALL
            SELECT 1, s.at, s.job_id, 'status', 'starting', s.message, jsonb_build_object('from', s.left_status)
            FROM started s
            UNION ALL
            SELECT 2, f.at, f.job_id, 'status', 'failed', f.message, jsonb_build_object('from', f.left_status)
            FROM failed f
        ) AS e
        ORDER BY e.part, e.at
    ),
    waiting AS (
        UPDATE jobs j SET pending_reason = coalesce(r.reason, j.pending_reason),
                          infeasible_since = CASE WHEN :clear_infeasible AND r.reason IS NOT NULL THEN NULL
                                                  ELSE j.infeasible_since END,
                          bypassed_since = CASE WHEN r.bypassed AND j.status = 'queued'
                                                THEN coalesce(j.bypassed_since, now()) ELSE j.bypassed_since END
        FROM jsonb_to_recordset(CAST(:reasons AS jsonb)) AS r(job_id uuid, reason text, bypassed boolean)
        WHERE j.id = r.job_id
          AND (j.pending_reason IS DISTINCT FROM coalesce(r.reason, j.pending_reason)
               OR (:clear_infeasible AND r.reason IS NOT NULL AND j.infeasible_since IS NOT NULL)
               OR (r.bypassed AND j.status = 'queued' AND j.bypassed_since IS NULL))
    )
    SELECT s.job_id, true, pg_notify(:channel, s.payload) FROM started s
    UNION ALL
    SELECT f.job_id, false, pg_notify(:channel, json_build_object('job_id', f.job_id, 'status', 'failed')::text)
    FROM failed f
    """
)


@dataclass(frozen=True)
class AdmittedGang:
    """One admitted job's rows for ROUND_WRITES, and the message of its status event."""

    job: QueuedJob
    n: int
    submission_id: str
    token_hash: str  # of its job token's claim (launch.build): the row authenticates nothing until claimed
    message: str
    selector: dict[str, str] | None = None  # the node-label domain it was placed inside (topology)


async def write_round(
    session: AsyncSession,
    *,
    gangs: Sequence[AdmittedGang] = (),
    warning: str | None = None,
    reasons: Mapping[uuid.UUID, str] | None = None,
    failures: Mapping[uuid.UUID, tuple[str, str]] | None = None,
    clear_infeasible: bool = True,
    bypassed: Sequence[uuid.UUID] = (),
    owner: str = "",
    lease_expires_at: datetime | None = None,
    channel: str = "",
) -> set[uuid.UUID]:
    """ROUND_WRITES; `warning` is an event for every gang that starts; `failures` (job id -> (error,
    event message)) fail; with `clear_infeasible` the waiting jobs are no longer marked infeasible
    (they can fit the cluster); `bypassed` were passed by a later job of their project (their
    `bypassed_since` is set unless it is already). Returns the ids of the gangs that moved to starting: a gang whose job
    left `queued` since the claim is left as it is."""
    if not gangs and not reasons and not failures and not bypassed:
        return set()
    gang_rows = [
        {
            "at": at,
            "job_id": str(gang.job.id),
            "n": gang.n,
            "submission_id": gang.submission_id,
            "message": gang.message,
            "token_id": str(uuid.uuid4()),
            "project_id": str(gang.job.project_id),
            "token_hash": gang.token_hash,
            "payload": json.dumps({"job_id": str(gang.job.id), "status": JobStatus.starting.value}),
            "selector": gang.selector,
        }
        for at, gang in enumerate(gangs)
    ]
    # One row per waiting job (a row changes once per statement): its new reason, whether it was passed.
    reasons, passed = reasons or {}, set(bypassed)
    reason_rows = [
        {"job_id": str(job_id), "reason": reasons.get(job_id), "bypassed": job_id in passed}
        for job_id in [*reasons, *(passed - reasons.keys())]
    ]
    failure_rows = [
        {"at": at, "job_id": str(job_id), "error": error, "message": message}
        for at, (job_id, (error, message)) in enumerate((failures or {}).items())
    ]
    result = await session.execute(
        ROUND_WRITES,
        {
            "gangs": json.dumps(gang_rows),
            "sources": STARTING_SOURCES,
            "failures": json.dumps(failure_rows),
            "failed_sources": FAILED_SOURCES,
            "warning": warning,
            "reasons": json.dumps(reason_rows),
            "clear_infeasible": clear_infeasible,
            "owner": owner,
            "lease_expires_at": lease_expires_at,
            "channel": channel,
        },
    )
    return {job_id for job_id, started, _ in result.all() if started}


# The launches Ray accepted, marked submitted under the fencing check of `leased_many` in one
# statement: the jobs still leased by this dispatcher are locked in id order, and only the attempt that
# is still a job's latest and still pending changes.
MARK_SUBMITTED = text(
    """
    WITH held AS MATERIALIZED (
        SELECT id FROM jobs WHERE id = ANY(CAST(:job_ids AS uuid[])) AND lease_owner = :owner ORDER BY id FOR UPDATE
    )
    UPDATE job_attempts a SET status = 'submitted'
    FROM held JOIN unnest(CAST(:job_ids AS uuid[]), CAST(:submission_ids AS text[])) AS s(job_id, submission_id)
         ON s.job_id = held.id
    WHERE a.job_id = held.id AND a.ray_submission_id = s.submission_id AND a.status = 'pending'
      AND a.n = (SELECT max(l.n) FROM job_attempts l WHERE l.job_id = held.id)
    """
)


async def mark_submitted(session: AsyncSession, submissions: Mapping[uuid.UUID, str], owner: str) -> None:
    await session.execute(
        MARK_SUBMITTED,
        {"job_ids": list(submissions), "submission_ids": list(submissions.values()), "owner": owner},
    )


# What an ended attempt leaves of its job (ending.release, and FAIL_LAUNCHES for many at once): no lease,
# no preemption pending, no cap on its size (a shrunk gang's next attempt may grow to its max).
RELEASED = (
    "lease_owner",
    "lease_expires_at",
    "preempted_by",
    "preempt_requested_at",
    "shrink_to",
    "shrink_requested_at",
)


# Launches that can never be made (their code package, Ray calling them invalid), failed in one
# statement under the same fencing as MARK_SUBMITTED: only a job still leased by this dispatcher whose
# latest attempt is still that pending submission changes. Each job moves as `moves` (its status ->
# the target the status machine allows: cancelling -> cancelled, else failed) says, or not at all;
# its attempt fails with the error, its lease and job tokens go, and its status event and NOTIFY are
# written, as `transition` and ending.finish would one job at a time. Returns the ids that moved.
FAIL_LAUNCHES = text(
    """
    WITH f AS (
        SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS f(at int, job_id uuid, submission_id text, error text)
    ),
    held AS MATERIALIZED (
        SELECT j.id, j.status, m.target FROM jobs j
        JOIN jsonb_each_text(CAST(:moves AS jsonb)) AS m(source, target) ON m.source = j.status::text
        WHERE j.id = ANY(CAST(:job_ids AS uuid[])) AND j.lease_owner = :owner ORDER BY j.id FOR UPDATE OF j
    ),
    attempts AS (
        UPDATE job_attempts a SET status = 'failed', finished_at = now(), error = f.error
        FROM held JOIN f ON f.job_id = held.id
        WHERE a.job_id = held.id AND a.ray_submission_id = f.submission_id AND a.status = 'pending'
          AND a.n = (SELECT max(l.n) FROM job_attempts l WHERE l.job_id = held.id)
        RETURNING a.job_id, a.n, f.at, f.error
    ),
    moved AS (
        UPDATE jobs j SET status = CAST(held.target AS job_status),
                          error = CASE WHEN held.target = 'failed' THEN attempts.error ELSE j.error END,
                          finished_at = now(), pending_reason = NULL, {released}
        FROM attempts JOIN held ON held.id = attempts.job_id
        WHERE j.id = attempts.job_id
        RETURNING j.id, held.target, held.status AS left_status, attempts.n, attempts.at, attempts.error
    ),
    tokens AS (
        UPDATE api_tokens SET revoked_at = now() WHERE job_id IN (SELECT id FROM moved) AND revoked_at IS NULL
    ),
    events AS (
        INSERT INTO job_events (job_id, kind, status, message, data)
        SELECT m.id, 'status', CAST(m.target AS job_status),
               CASE WHEN m.target = 'failed' THEN 'attempt ' || m.n || ' could not be launched: ' || m.error
                    ELSE 'cancelled before launch' END,
               jsonb_build_object('from', m.left_status)
        FROM moved m ORDER BY m.at
    )
    SELECT m.id, pg_notify(:channel, json_build_object('job_id', m.id, 'status', m.target)::text) FROM moved m
    """.format(released=", ".join(f"{name} = NULL" for name in RELEASED))
)


def _fail_target(status: JobStatus) -> JobStatus:
    return JobStatus.cancelled if status is JobStatus.cancelling else JobStatus.failed


# FAIL_LAUNCHES's `moves`: each status the status machine lets end that way, and its end.
FAIL_MOVES = json.dumps({s.value: _fail_target(s).value for s in JobStatus if can_transition(s, _fail_target(s))})


async def fail_launches(
    session: AsyncSession, failures: Mapping[uuid.UUID, tuple[str, str]], owner: str, channel: str
) -> set[uuid.UUID]:
    """FAIL_LAUNCHES for `failures` (job id -> (submission id, error)); the ids of the jobs that moved."""
    if not failures:
        return set()
    rows = [
        {"at": at, "job_id": str(job_id), "submission_id": submission, "error": error}
        for at, (job_id, (submission, error)) in enumerate(failures.items())
    ]
    result = await session.execute(
        FAIL_LAUNCHES,
        {
            "rows": json.dumps(rows),
            "job_ids": list(failures),  # the primary key's index finds them (a join on `rows` scanned jobs)
            "moves": FAIL_MOVES,
            "owner": owner,
            "channel": channel,
        },
    )
    return {row[0] for row in result.all()}
