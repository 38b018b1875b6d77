"""Server-side commands behind `trainmaster api | db upgrade | token create`."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from api.auth.service import create_project_token
from api.db import migrate
from api.db.session import create_engine, session_factory
from api.settings import get_settings


def serve(host: str | None, port: int | None, workers: int = 1) -> None:
    settings = get_settings()
    logging.basicConfig(
        level=logging.INFO,
        format='{"ts":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}',
    )
    uvicorn.run(
        "api.app:app_factory",
        factory=True,
        host=host or settings.api_host,
        port=port or settings.api_port,
        workers=workers,
        log_level="info",
        timeout_graceful_shutdown=5,
    )


def db_upgrade(revision: str = "head") -> None:
    migrate.upgrade(get_settings().database_url, revision)


def token_create(project: str, description: str | None = None) -> str:
    async def run() -> str:
        engine = create_engine(get_settings())
        try:
            async with session_factory(engine)() as session:
                token = await create_project_token(session, project, description)
                await session.commit()
                return token
        finally:
            await engine.dispose()

    return asyncio.run(run())
