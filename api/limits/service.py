"""The write limits' decisions: each refuses before anything is written, with 429 (LimitExceeded) naming
the limit, its value and the setting that raises it, or 413 for one request that no wait would let
through. Rates are in memory (api/limits/buckets.py); totals are one capped, indexed count of the
writer's own rows (api/limits/repository.py), so neither reads nor locks another project's rows."""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.deps import ProjectPrincipal
from api.auth.principal import Principal
from api.db.direct import Direct
from api.db.session import Session
from api.errors import LimitExceeded, PayloadTooLarge, limit_detail
from api.limits import repository
from api.limits.buckets import Buckets
from api.settings import Settings


class Limit(NamedTuple):
    what: str
    setting: str

    def detail(self, value: float) -> str:
        return limit_detail(self.what, value, self.setting)

    def exceeded(self, value: float, retry_after_s: float | None = None) -> LimitExceeded:
        return LimitExceeded(self.what, value, self.setting, retry_after_s=retry_after_s)


POINTS_PER_JOB = Limit("metric points per job per second", "TRAINMASTER_METRIC_POINTS_PER_JOB_PER_S")
POINTS_PER_PROJECT = Limit("metric points per project per second", "TRAINMASTER_METRIC_POINTS_PER_PROJECT_PER_S")
NAMES_PER_JOB = Limit("metric names per job", "TRAINMASTER_METRIC_NAMES_PER_JOB")
EVENTS_PER_JOB = Limit("events per job", "TRAINMASTER_EVENTS_PER_JOB")
EVENTS_PER_PROJECT = Limit("events per project per second", "TRAINMASTER_EVENTS_PER_PROJECT_PER_S")
CHECKPOINTS_PER_JOB = Limit("checkpoints per job", "TRAINMASTER_CHECKPOINTS_PER_JOB")
TOKENS_PER_PROJECT = Limit("live tokens per project", "TRAINMASTER_TOKENS_PER_PROJECT")
LOG_LINES_PER_JOB = Limit("log lines per job", "TRAINMASTER_LOG_LINES_PER_JOB")


@dataclass
class _Names:
    stored: set[str] = field(default_factory=set)  # names seen stored: a batch of only these needs no look-up
    counted: int | None = None  # the job's distinct names as last counted, plus those let through since


class KnownNames:
    """What an API process knows of each job's metric names, so the usual batch (names seen before)
    costs no database look-up. At most `max_names` names are kept, the least recently used job's
    forgotten first (it is looked up again). Names are never removed from a running job."""

    def __init__(self, max_names: int = 200_000):
        self.max_names = max_names
        self.held = 0
        self.jobs: OrderedDict[uuid.UUID, _Names] = OrderedDict()

    def of(self, job_id: uuid.UUID) -> _Names:
        names = self.jobs.get(job_id)
        if names is None:
            names = self.jobs[job_id] = _Names()
        self.jobs.move_to_end(job_id)
        return names

    def add(self, job_id: uuid.UUID, names: Collection[str]) -> None:
        known = self.of(job_id).stored
        before = len(known)
        known.update(names)
        self.held += len(known) - before
        while self.held > self.max_names and len(self.jobs) > 1:
            _, forgotten = self.jobs.popitem(last=False)
            self.held -= len(forgotten.stored)


class WriteLimits:
    """One per API process (`write_limits`): the rate buckets and the known metric names."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        burst = settings.write_burst_s
        self.job_points = Buckets(settings.metric_points_per_job_per_s, burst, clock=clock)
        self.project_points = Buckets(settings.metric_points_per_project_per_s, burst, clock=clock)
        self.project_events = Buckets(settings.events_per_project_per_s, burst, clock=clock)
        self.names = KnownNames()

    def take_points(self, project_id: uuid.UUID, job_id: uuid.UUID, count: int) -> None:
        """Take a batch's points from its job's bucket and its project's, or refuse it. The job's bucket
        is keyed by the caller's project too: a token naming another project's job takes from its own."""
        settings = self.settings
        for buckets, key, limit, value in (
            (self.job_points, (project_id, job_id), POINTS_PER_JOB, settings.metric_points_per_job_per_s),
            (self.project_points, project_id, POINTS_PER_PROJECT, settings.metric_points_per_project_per_s),
        ):
            if buckets.enabled and count > buckets.capacity:
                raise PayloadTooLarge(
                    f"a batch of {count} metric points is more than {buckets.capacity:.0f}, what this limit lets "
                    f"through at once (TRAINMASTER_WRITE_BURST_S seconds of it): {limit.detail(value)}"
                )
            wait = buckets.wait_s(key, count)
            if wait > 0:
                raise limit.exceeded(value, wait)
        self.job_points.take((project_id, job_id), count)
        self.project_points.take(project_id, count)

    def give_points(self, project_id: uuid.UUID, job_id: uuid.UUID, count: int) -> None:
        """Back the points of a batch that stored nothing (a duplicate, or no such job)."""
        self.job_points.give((project_id, job_id), count)
        self.project_points.give(project_id, count)

    async def check_metric_names(
        self, direct: Direct, job_id: uuid.UUID, project_id: uuid.UUID, names: Collection[str]
    ) -> None:
        """Refuse a batch that would take its job past its distinct metric names. Names this process saw
        the job store cost nothing; others one probe each, and a count of the job's names only while the
        count last read leaves no room for them. Batches checked at once may each pass with the last
        names that fit: the limit is exceeded by at most the new names of batches in flight together."""
        limit = self.settings.metric_names_per_job
        if not limit:
            return
        known = self.names.jobs.get(job_id)
        unknown = [name for name in names if known is None or name not in known.stored]
        if not unknown:
            return
        new = await repository.new_metric_names(direct, job_id, project_id, unknown)
        if new is None:  # no such job: the store answers 404
            return
        if len(new) > limit:
            raise PayloadTooLarge(f"a batch naming {len(new)} new metric names: {NAMES_PER_JOB.detail(limit)}")
        if not new:
            return
        job = self.names.of(job_id)
        if job.counted is None or job.counted + len(new) > limit:  # names only grow: a count that fits holds
            job.counted = await repository.metric_names(direct, job_id, limit)
        if job.counted + len(new) > limit:
            raise NAMES_PER_JOB.exceeded(limit)
        job.counted += len(new)

    def names_stored(self, job_id: uuid.UUID, names: Collection[str]) -> None:
        if self.settings.metric_names_per_job:
            self.names.add(job_id, names)

    def take_event(self, project_id: uuid.UUID) -> None:
        wait = self.project_events.wait_s(project_id, 1)
        if wait > 0:
            raise EVENTS_PER_PROJECT.exceeded(self.settings.events_per_project_per_s, wait)
        self.project_events.take(project_id, 1)

    async def check_new_event(self, session: AsyncSession, job_id: uuid.UUID) -> None:
        """Before an event adds a row (a repeat of the job's latest adds none and is not refused)."""
        limit = self.settings.events_per_job
        if limit and await repository.events(session, job_id, limit) >= limit:
            raise EVENTS_PER_JOB.exceeded(limit)

    async def check_checkpoint(self, session: AsyncSession, job_id: uuid.UUID, path: str) -> None:
        """Before a checkpoint row; a path reported again stores nothing and is not refused. Holds the
        job's checkpoint lock to the commit."""
        limit = self.settings.checkpoints_per_job
        if not limit:
            return
        await repository.lock_checkpoints(session, job_id)
        full = await repository.checkpoints(session, job_id, limit) >= limit
        if full and not await repository.checkpoint_known(session, job_id, path):
            raise CHECKPOINTS_PER_JOB.exceeded(limit)

    async def check_token(self, session: AsyncSession, principal: Principal) -> None:
        """Before a project token mints a token of its project (an admin's are not counted against it).
        Holds the project's token lock to the commit."""
        limit = self.settings.tokens_per_project
        if not limit or principal.is_admin:
            return
        await repository.lock_tokens(session, principal.project_id)
        if await repository.live_tokens(session, principal.project_id, limit) >= limit:
            raise TOKENS_PER_PROJECT.exceeded(limit)


def limits_of(state: Any) -> WriteLimits:
    """The app's WriteLimits (its `app.state`), made with its settings at the first write that asks."""
    limits: WriteLimits | None = getattr(state, "write_limits", None)
    if limits is None:
        limits = state.write_limits = WriteLimits(state.settings)
    return limits


def write_limits(request: Request) -> WriteLimits:
    return limits_of(request.app.state)


Limits = Annotated[WriteLimits, Depends(write_limits)]


async def within_token_limit(session: Session, principal: ProjectPrincipal, limits: Limits) -> None:
    """A route's dependency (POST /v1/tokens): the request's own session, so the project's token lock
    is held until the token is committed."""
    await limits.check_token(session, principal)
