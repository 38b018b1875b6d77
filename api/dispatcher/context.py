"""What the steps of a dispatcher round share (admission.py, launch.py, reconcile.py): the settings,
the database, Ray, this dispatcher's name and the fencing check bound to it.

The steps take this, never the `Dispatcher` (service.py), so imports point one way: service.py
imports the steps, the steps import this module.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.dispatcher.backend import RayBackend
from api.dispatcher.leases import Held, leased, leased_many
from api.settings import Settings


@dataclass
class RoundContext:
    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    ray: RayBackend
    owner: str  # this dispatcher's lease owner name
    ray_down_since: float | None = None  # time.monotonic() when Ray was first found unreachable

    def leased(self, job_id: uuid.UUID, submission_id: str | None = None) -> AbstractAsyncContextManager[Held | None]:
        return leased(self.sessions, job_id, self.owner, submission_id)

    def leased_many(self, submissions: Mapping[uuid.UUID, str]) -> AbstractAsyncContextManager[list[Held]]:
        return leased_many(self.sessions, submissions, self.owner)
