"""The limit on the log lines stored per job (TRAINMASTER_LOG_LINES_PER_JOB), where the dispatcher writes
them (api/logs/repository.py `append`, under the job's log lock).

Lines past the limit are dropped, and one line saying so is stored in their place, so the job's owner
sees where the log stops and why. Counting a job's lines afresh at every append would read all of them;
instead each process keeps, per job, the count and last seq it read from the database, and each append
counts only the lines after that seq: the lines stored since (by this process or another), committed.
A transaction rolled back (a lost lease) leaves nothing counted, so the count stays exact."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from api.limits import repository
from api.limits.service import LOG_LINES_PER_JOB

MAX_JOBS = 100_000  # jobs whose counts a process keeps; a forgotten one is counted again from its first line


class LogLineCounts:
    def __init__(self, max_jobs: int = MAX_JOBS):
        self.max_jobs = max_jobs
        self.counted: OrderedDict[uuid.UUID, tuple[int, int]] = OrderedDict()  # job: (lines, last seq)

    async def stored(self, session: AsyncSession, job_id: uuid.UUID, cap: int) -> int:
        """The job's lines stored and committed, counted up to `cap`."""
        lines, last = self.counted.pop(job_id, (0, 0))
        more, last = await repository.log_lines_after(session, job_id, last, cap)
        self.counted[job_id] = (lines + more, last)
        while len(self.counted) > self.max_jobs:
            self.counted.popitem(last=False)
        return lines + more

    async def kept(self, session: AsyncSession, job_id: uuid.UUID, lines: Sequence[str], limit: int) -> Sequence[str]:
        """The lines to store within the limit (0: no limit): all, the first few and the line saying the
        rest were dropped, or none once that line is stored."""
        if not limit:
            return lines
        room = limit - await self.stored(session, job_id, limit + 1)
        if room >= len(lines):
            return lines
        if room < 0:
            return []
        dropped = f"[trainmaster] log lines past this one are not stored: {LOG_LINES_PER_JOB.detail(limit)}"
        return [*lines[:room], dropped]


counts = LogLineCounts()
