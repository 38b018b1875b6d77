"""How many code uploads one API process holds at once.

An upload is read whole (up to max_code_bytes), then inspected, hashed and stored: without a bound,
a tenant sending many at once makes the process that serves every project hold them all. The gate
lets `in_flight` uploads be read at a time, at most `per_project` of them one project's; an upload
past either waits up to `wait_s` before its body is read (it stays in the socket meanwhile), then is
refused with 429 naming the setting that raises the limit.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from api.errors import LimitExceeded
from api.settings import Settings

IN_FLIGHT = ("code uploads in flight per API process", "TRAINMASTER_CODE_UPLOADS_IN_FLIGHT")
PER_PROJECT = ("code uploads in flight per project", "TRAINMASTER_CODE_UPLOADS_IN_FLIGHT_PER_PROJECT")


class UploadGate:
    def __init__(self, in_flight: int, per_project: int, wait_s: float):
        self.in_flight = in_flight
        self.per_project = per_project
        self.wait_s = wait_s
        self.held: Counter[uuid.UUID] = Counter()
        self.changed = asyncio.Condition()

    @classmethod
    def of(cls, settings: Settings) -> UploadGate:
        return cls(
            settings.code_uploads_in_flight, settings.code_uploads_in_flight_per_project, settings.code_upload_wait_s
        )

    def _refusal(self, project_id: uuid.UUID) -> tuple[str, str, int] | None:
        if self.held[project_id] >= self.per_project:
            return (*PER_PROJECT, self.per_project)
        if sum(self.held.values()) >= self.in_flight:
            return (*IN_FLIGHT, self.in_flight)
        return None

    @asynccontextmanager
    async def slot(self, project_id: uuid.UUID) -> AsyncIterator[None]:
        """Hold one of the uploads in flight for `project_id` while the block runs."""
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self._refusal(project_id) is None), self.wait_s)
            except TimeoutError:
                what, setting, value = self._refusal(project_id) or (*IN_FLIGHT, self.in_flight)
                raise LimitExceeded(what, value, setting, retry_after_s=self.wait_s or 1.0) from None
            self.held[project_id] += 1
        try:
            yield
        finally:
            async with self.changed:
                self.held[project_id] -= 1
                if not self.held[project_id]:
                    del self.held[project_id]
                self.changed.notify_all()
