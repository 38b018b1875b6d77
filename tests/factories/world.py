"""The dispatcher's world without Ray: a migrated database, the exact in-memory fake of Ray
(tests/factories/ray.py) and as many dispatchers as a test asks for, each a real `Dispatcher`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import select

from api.auth.principal import Principal
from api.auth.repository import get_or_create_project
from api.db.direct import OnSession
from api.db.models import Job, JobAttempt
from api.db.session import create_engine, session_factory
from api.dispatcher.service import Dispatcher
from api.jobs import service as jobs
from api.settings import Settings
from tests.factories.ray import FakeRay
from trainmaster.models import JobSpec

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


class World:
    """A database, a fake Ray, and as many dispatchers as a test wants."""

    def __init__(self, database_url: str, **settings: Any):
        self.settings = Settings(
            **{"database_url": database_url, "lease_s": 30, "infeasible_timeout_s": 600, **settings}
        )
        self.ray = FakeRay()

    async def __aenter__(self) -> World:
        self.engine = create_engine(self.settings)
        self.sessions = session_factory(self.engine)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.dispose()

    def dispatcher(self, owner: str = "d1") -> Dispatcher:
        return Dispatcher(settings=self.settings, sessions=self.sessions, ray=self.ray, owner=owner)

    async def submit(self, project: str = "alpha", **fields: Any) -> uuid.UUID:
        body = {"name": "j", "entrypoint": "builtin:mlp", **fields}
        async with self.sessions() as session, session.begin():
            row = await get_or_create_project(session, project)
            principal = Principal(project_id=row.id, project_name=project)
            job, _ = await jobs.submit(OnSession(session), principal, JobSpec.model_validate(body), None)
            return job.id

    async def job(self, job_id: uuid.UUID) -> Job:
        from sqlalchemy.orm import selectinload

        async with self.sessions() as session:
            query = select(Job).where(Job.id == job_id).options(selectinload(Job.attempts))
            return (await session.execute(query)).scalar_one()

    async def events(self, job_id: uuid.UUID) -> list[Any]:
        from api.db.models import JobEvent

        async with self.sessions() as session:
            query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            return list((await session.execute(query)).scalars())

    async def attempts(self, job_id: uuid.UUID) -> list[JobAttempt]:
        return sorted((await self.job(job_id)).attempts, key=lambda a: a.n)

    async def execute(self, fn: Callable[[Any], Awaitable[Any]]) -> None:
        async with self.sessions() as session, session.begin():
            await fn(session)


def one_worker(cpus: float = 1) -> dict[str, Any]:
    return {"scaling": {"num_workers": 1, "resources_per_worker": {"CPU": cpus}}}


async def submit_as(world: World, project: str, user: str, **fields: Any) -> uuid.UUID:
    """A job submitted with a token that names `user`, as `token create --user` makes one."""
    async with world.sessions() as session, session.begin():
        row = await get_or_create_project(session, project)
        principal = Principal(project_id=row.id, project_name=project, user_name=user)
        body = {"name": f"{user}-job", "entrypoint": "builtin:mlp", **fields}
        job, _ = await jobs.submit(OnSession(session), principal, JobSpec.model_validate(body), None)
        return job.id
