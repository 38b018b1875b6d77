"""The checkpoint collector: deletes from storage the checkpoints that nothing keeps any more, and marks
their rows (`deleted_at`, `deleted_why`), so that the API lists exactly what is on disk.

What keeps a checkpoint (anything else is deleted):
- it is pinned (`POST /v1/jobs/{id}/checkpoints/{n}/pin`);
- while its job's project retention has not run out (`checkpoint_retention_days` after the job
  finished; unset: forever), it is one of the job's latest `checkpoint.num_to_keep` (all when
  unset) or the job's best by `checkpoint.keep_best` (the metric reported with it; a checkpoint
  without that metric as a number is never the best).

The dispatcher runs a pass every `checkpoint_gc_interval_s` (`collect_every`, a task beside its rounds),
on the storage it gives jobs
(`storage_path`): it is the process that sees the same filesystem as the cluster's checkpoints.
Only local storage is collected: with a remote URI (s3://, gs://) Ray's own `num_to_keep` deletes
(workers/driver.py hands it to Ray then) and pins and `keep_best` are not honoured. A storage folder
that does not exist on the dispatcher's host (not mounted there) is not collected at all, rather than
every checkpoint being marked as gone: the dispatcher must mount the storage the Ray nodes write.

A job's code is hostile, and so are its checkpoint paths and every folder it can write: a path is
removed only below the job's own folder, `<storage>/<project id>/<job id>/` (or `<storage>/<job id>/`,
the layout before storage was per project), where Ray Train writes the run of that name, reached from
the storage root through folders opened without following links (trainmaster/safe_paths.py), and,
when the dispatcher runs as root, as the OS user that owns the project's folder (the cluster's user
that wrote it), never as root. Any other path is marked deleted without touching a file, and says so;
a link or a file where the project's folder, the job's or a folder on the way should be also records
an event on the job (`checkpoint_not_removed`) naming it.

Rows are taken `FOR UPDATE SKIP LOCKED`, a bounded number per pass, so several dispatchers share the
work and none deletes a checkpoint twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.db.models import Job
from api.dispatcher import checkpoint_sizes
from api.jobs.status import record_event
from trainmaster import safe_paths
from trainmaster.context import run_folders

log = logging.getLogger("trainmaster.checkpoints")

PASS_LIMIT = 200  # checkpoints deleted per pass (each a folder removed from disk)

# The checkpoints nothing keeps, with why: the newest first per job (newest_rank 1), the best by the
# job's keep_best metric (best_rank 1; a metric that is not a number ranks last), and the project's
# retention once the job finished. Only live rows of jobs that ask for collection are read
# (ix_checkpoints_live), and only those of jobs with a policy or a finished job under a retention.
DUE = text(
    """
    WITH live AS (
        SELECT c.id, c.job_id, j.project_id, c.path, c.pinned,
               (j.spec #>> '{checkpoint,num_to_keep}')::int AS keep,
               j.finished_at IS NOT NULL AND p.checkpoint_retention_days IS NOT NULL
                 AND j.finished_at < now() - make_interval(secs => p.checkpoint_retention_days * 86400)
                 AS expired,
               p.checkpoint_retention_days AS days,
               row_number() OVER (PARTITION BY c.job_id ORDER BY c.id DESC) AS newest_rank,
               row_number() OVER (
                   PARTITION BY c.job_id
                   ORDER BY CASE WHEN jsonb_typeof(c.metrics -> (j.spec #>> '{checkpoint,keep_best,metric}')) = 'number'
                            THEN (c.metrics ->> (j.spec #>> '{checkpoint,keep_best,metric}'))::float8
                                 * CASE WHEN j.spec #>> '{checkpoint,keep_best,mode}' = 'min' THEN -1 ELSE 1 END
                            END DESC NULLS LAST,
                            c.id DESC
               ) AS best_rank,
               j.spec #> '{checkpoint,keep_best}' IS NOT NULL AND j.spec #> '{checkpoint,keep_best}' <> 'null'
                 AS has_best
        FROM checkpoints c
        JOIN jobs j ON j.id = c.job_id
        JOIN projects p ON p.id = j.project_id
        WHERE c.deleted_at IS NULL
          AND (j.spec #> '{checkpoint,num_to_keep}' IS NOT NULL
               OR (j.finished_at IS NOT NULL AND p.checkpoint_retention_days IS NOT NULL))
    )
    SELECT id, job_id, project_id, path,
           CASE WHEN expired THEN format('the project keeps checkpoints %s days after the job finished', days)
                ELSE format('not among the job''s latest %s', keep)
                     || CASE WHEN has_best THEN ' nor its best by keep_best' ELSE '' END
           END AS why
    FROM live
    WHERE NOT pinned
      AND (expired OR (keep IS NOT NULL AND newest_rank > keep AND NOT (has_best AND best_rank = 1)))
    ORDER BY id
    LIMIT :limit
    """
)
# Locks the rows of a pass (another dispatcher's pass, or a pin being written, holds them: skipped), and
# checks them again as they are now: one pinned since DUE read it stays.
LOCK = text(
    "SELECT id FROM checkpoints WHERE id = ANY(:ids) AND deleted_at IS NULL AND NOT pinned FOR UPDATE SKIP LOCKED"
)
MARK = text(
    """
    UPDATE checkpoints SET deleted_at = now(), deleted_why = marked.why
    FROM unnest(CAST(:ids AS bigint[]), CAST(:whys AS text[])) AS marked(id, why)
    WHERE checkpoints.id = marked.id
    """
)


@dataclass
class Collected:
    deleted: int = 0  # folders removed from disk
    marked: int = 0  # rows marked deleted (also those whose files were gone or not the job's)


# What became of a checkpoint's files, for its `deleted_why`; an error leaves the row for a later pass.
OUTCOMES = {
    "removed": "",
    "gone": "; its files were already gone",
    "outside": "; its path is outside the job's storage folder, so no file was removed",
    "linked": "; its path leads outside the job's storage folder through a link ({detail}), so no file was removed",
    "not_a_folder": (
        "; its path leads outside the job's storage folder: {detail} is not a folder, so no file was removed"
    ),
}


async def _refused_event(session: AsyncSession, row: Any, result: safe_paths.Result) -> None:
    job = await session.get(Job, row.job_id)
    if job is None:
        return
    what = "a link" if result.outcome == "linked" else "not a folder"
    message = (
        f"checkpoint {row.path} was not removed: {result.detail} (below the storage root) is {what}, "
        "so the path is not the job's"
    )
    data = {"checkpoint_id": row.id, "path": row.path, "component": result.detail, "kind": result.outcome}
    await record_event(session, job, "checkpoint_not_removed", message, data)


async def collect(sessions: async_sessionmaker[AsyncSession], storage_path: str, limit: int = PASS_LIMIT) -> Collected:
    """One pass: delete and mark up to `limit` checkpoints that nothing keeps."""
    done = Collected()
    if "://" in storage_path:
        return done  # remote storage: Ray's num_to_keep deletes (see the module's docstring)
    storage = Path(storage_path).expanduser()
    async with sessions() as session, session.begin():
        due = (await session.execute(DUE, {"limit": limit})).all()
        if not due:
            return done
        if not storage.is_dir():  # not mounted on this host: nothing can be checked, so nothing is marked
            log.warning("checkpoint_storage_missing", extra={"storage_path": storage_path, "due": len(due)})
            return done
        locked = set((await session.execute(LOCK, {"ids": [row.id for row in due]})).scalars())
        rows = [row for row in due if row.id in locked]  # the others: another dispatcher's pass holds them
        requests = [
            safe_paths.Request("remove", row.path, run_folders(str(row.project_id), str(row.job_id))) for row in rows
        ]
        try:
            results = await asyncio.to_thread(safe_paths.perform, str(storage), requests)
        except OSError as exc:  # the storage root itself could not be opened: the next pass tries again
            log.warning("checkpoint_storage_unreadable", extra={"error": str(exc)[:200]})
            return done
        ids, whys, refused = [], [], []
        for row, result in zip(rows, results, strict=True):
            if result.outcome not in OUTCOMES:  # left for a later pass; said once per pass
                log.warning("checkpoint_not_removed", extra={"checkpoint_id": row.id, "error": result.detail})
                continue
            if result.outcome == "removed":
                done.deleted += 1
            ids.append(row.id)
            whys.append(row.why + OUTCOMES[result.outcome].format(detail=result.detail))
            if result.outcome in ("linked", "not_a_folder"):
                refused.append((row, result))
        if ids:
            await session.execute(MARK, {"ids": ids, "whys": whys})
            for row, result in refused:
                await _refused_event(session, row, result)
            done.marked = len(ids)
            log.info("checkpoints_collected", extra={"marked": done.marked, "removed": done.deleted})
    return done


async def collect_every(
    sessions: async_sessionmaker[AsyncSession], storage_path: str, every_s: float, stopping: asyncio.Event
) -> None:
    """A pass now and every `every_s` until `stopping` is set (never when `every_s` is 0), each followed
    by a pass that measures checkpoints (api/dispatcher/checkpoint_sizes.py); a pass that raises is logged and the
    next one tries again."""
    if every_s <= 0:
        return
    while not stopping.is_set():
        try:
            await collect(sessions, storage_path)
        except Exception as exc:
            log.exception("checkpoint_collection_failed", extra={"error": str(exc)[:300]})
        try:
            await checkpoint_sizes.measure(sessions, storage_path)
        except Exception as exc:
            log.exception("checkpoint_measuring_failed", extra={"error": str(exc)[:300]})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), every_s)
