"""Retention: metric points and logs of jobs that finished more than `retention_days` ago are
deleted; the job, its attempts, events and checkpoints stay.

Deletes go `retention_batch` rows per transaction, each a short one that locks only the rows it
deletes, which belong to finished jobs nobody writes to any more (their job tokens are revoked): ingest
into other jobs never waits on it. One API replica purges at a time (a transaction advisory lock held for the pass).

Code packages that no job (of any status) or sweep names and that were uploaded more than
`code_retention_days` ago are deleted too, with their unpacked folder on this host once no project
stores that archive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.code_packages import archive
from api.retention import repository
from api.settings import Settings

log = logging.getLogger("trainmaster.retention")
CODE_BATCH = 100  # code packages deleted per transaction (each holds up to max_code_bytes)


@dataclass
class Purged:
    jobs: int = 0
    rows: int = 0
    transactions: int = 0
    code_packages: int = 0


async def purge_round(
    sessions: async_sessionmaker[AsyncSession],
    *,
    days: float | None,
    batch: int,
    max_jobs: int = 100,
    code_days: float | None = None,
    code_cache: Path | None = None,
) -> Purged:
    """Purge up to `max_jobs` due jobs (none when `days` is None) and every unused code package older
    than `code_days` (none when None); nothing when another replica holds the purge lock."""
    purged = Purged()
    # The lock lives in a transaction of its own, on a connection checked out for the whole pass, so it
    # ends with that transaction however the pass ends (done, raised, cancelled, connection lost). A
    # session lock taken on a pooled connection stayed on it once the connection went back to the pool,
    # and the unlock could run on another one: the lock leaked to whoever used the first connection next.
    async with sessions() as lock_session, lock_session.begin():
        if not await repository.try_lock(lock_session):
            return purged
        if days is not None:
            async with sessions() as session:
                due = await repository.expired_jobs(session, days, max_jobs)
            for job_id in due:
                await _purge_job(sessions, job_id, batch, purged)
        if code_days is not None:
            await _purge_code(sessions, code_days, code_cache, purged)
    return purged


async def _purge_job(sessions: async_sessionmaker[AsyncSession], job_id: uuid.UUID, batch: int, purged: Purged) -> None:
    """The bulky tables first, then the small ones, then the mark: a purge cut short resumes whole."""
    for table in ("metric_points", "log_lines"):
        after = 0
        while True:
            async with sessions() as session, session.begin():
                deleted, after = await repository.delete_points_or_lines(session, table, job_id, batch, after)
            purged.transactions += 1
            purged.rows += deleted
            if deleted < batch:
                break
    for table in ("metric_blocks", "metric_batches"):
        while True:
            async with sessions() as session, session.begin():
                deleted = await repository.delete_small(session, table, job_id, batch)
            purged.transactions += 1
            purged.rows += deleted
            if deleted < batch:
                break
    async with sessions() as session, session.begin():
        await repository.mark_purged(session, job_id)
    purged.jobs += 1


async def _purge_code(
    sessions: async_sessionmaker[AsyncSession], days: float, cache_root: Path | None, purged: Purged
) -> None:
    """Unused packages, CODE_BATCH per transaction; after each, the unpacked folders (in `cache_root`,
    on this host) of the archives no project stores any more."""
    while True:
        async with sessions() as session, session.begin():
            deleted = await repository.delete_unused_code(session, days, CODE_BATCH)
        purged.transactions += 1
        purged.code_packages += len(deleted)
        if deleted and cache_root is not None:
            async with sessions() as session:
                gone = set(deleted) - await repository.stored_code(session, deleted)
            for code_id in gone:
                await asyncio.to_thread(archive.discard, cache_root, code_id)
        if len(deleted) < CODE_BATCH:
            return


@dataclass
class Retention:
    task: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def start_retention(settings: Settings, sessions: async_sessionmaker[AsyncSession]) -> Retention:
    """The purge loop when `retention_days` or `code_retention_days` is set; nothing otherwise (data
    is kept forever)."""
    days, code_days = settings.retention_days, settings.code_retention_days
    if days is None and code_days is None:
        return Retention()
    code_cache = Path(settings.code_cache_path).expanduser()

    async def loop() -> None:
        while True:
            try:
                purged = await purge_round(
                    sessions, days=days, batch=settings.retention_batch, code_days=code_days, code_cache=code_cache
                )
                if purged.jobs or purged.code_packages:
                    log.info(
                        "retention_purged",
                        extra={
                            "jobs": purged.jobs,
                            "rows": purged.rows,
                            "code_packages": purged.code_packages,
                            "transactions": purged.transactions,
                        },
                    )
            except Exception:  # a database outage: try again next round
                log.warning("retention_round_failed", exc_info=True)
            await asyncio.sleep(settings.retention_interval_s)

    return Retention(asyncio.create_task(loop(), name="trainmaster-retention"))
