"""Checkpoint sizes measured by the platform: what storage quotas and `GET /v1/storage` count.

A job reports its checkpoint's size with it (`size_bytes`), and a job's code is hostile: that figure is
only a hint, counted until the platform measures the folder. After each collector pass (checkpoint_collector.py's
`collect_every`), the dispatcher measures live checkpoints on local storage: the bytes of the regular
files below the checkpoint, each inode once, reached through the same walk as removals
(trainmaster/safe_paths.py: folders opened without following links, as the project folder's owner when
the dispatcher is root; a link is neither followed nor counted). The measured bytes replace `size_bytes`
and `size_measured_at` says when (migration 0028); the storage figures follow through 0019's triggers.
A path that is not the job's, or holds nothing, measures 0 bytes.

Bounded per pass: at most `MEASURE_LIMIT` checkpoints, unmeasured ones first (by id), then those
measured longest ago, once `REMEASURE_AFTER_S` has passed (a job may write into a checkpoint after it
was measured); each walk stats at most `ENTRIES_PER_CHECKPOINT` entries, and a checkpoint with more
counts what was reached (logged as `checkpoint_measure_truncated`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from trainmaster import safe_paths
from trainmaster.context import run_folders

log = logging.getLogger("trainmaster.checkpoints")

MEASURE_LIMIT = 100
ENTRIES_PER_CHECKPOINT = 100_000
REMEASURE_AFTER_S = 3600.0

DUE = text(
    """
    SELECT due.id, due.path, due.job_id, j.project_id FROM (
        (SELECT id, path, job_id FROM checkpoints
         WHERE deleted_at IS NULL AND size_measured_at IS NULL ORDER BY id LIMIT :limit)
        UNION ALL
        (SELECT id, path, job_id FROM checkpoints
         WHERE deleted_at IS NULL AND size_measured_at < now() - make_interval(secs => :again_s)
         ORDER BY size_measured_at LIMIT :limit)
        LIMIT :limit
    ) due JOIN jobs j ON j.id = due.job_id
    """
)
# A row deleted meanwhile (by the collector, or refused) keeps what it had: it no longer counts.
STORE = text(
    """
    UPDATE checkpoints SET size_bytes = measured.bytes, size_measured_at = now()
    FROM unnest(CAST(:ids AS bigint[]), CAST(:sizes AS bigint[])) AS measured(id, bytes)
    WHERE checkpoints.id = measured.id AND checkpoints.deleted_at IS NULL
    """
)
NOTHING_THERE = ("gone", "outside", "linked", "not_a_folder")


async def measure(sessions: async_sessionmaker[AsyncSession], storage_path: str, limit: int = MEASURE_LIMIT) -> int:
    """One pass: measures up to `limit` live checkpoints and stores their sizes; how many it stored."""
    if "://" in storage_path:
        return 0  # remote storage: what the job reported is all there is
    storage = Path(storage_path).expanduser()
    async with sessions() as session:
        due = (await session.execute(DUE, {"limit": limit, "again_s": REMEASURE_AFTER_S})).all()
    if not due or not storage.is_dir():  # not mounted here: nothing can be measured (checkpoint_collector.py says so)
        return 0
    requests = [
        safe_paths.Request(
            "measure", row.path, run_folders(str(row.project_id), str(row.job_id)), ENTRIES_PER_CHECKPOINT
        )
        for row in due
    ]
    results = await asyncio.to_thread(safe_paths.perform, str(storage), requests)
    ids, sizes = [], []
    for row, result in zip(due, results, strict=True):
        if result.outcome == "measured":
            if not result.complete:
                log.warning("checkpoint_measure_truncated", extra={"checkpoint_id": row.id, "bytes": result.bytes})
            ids.append(row.id)
            sizes.append(result.bytes)
        elif result.outcome in NOTHING_THERE:
            ids.append(row.id)
            sizes.append(0)
        else:  # tried again by a later pass
            log.warning("checkpoint_not_measured", extra={"checkpoint_id": row.id, "error": result.detail})
    if ids:
        async with sessions() as session, session.begin():
            await session.execute(STORE, {"ids": ids, "sizes": sizes})
    return len(ids)
