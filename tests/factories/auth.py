"""Tokens made through the real auth service, as `trainmaster token create` makes them."""

from __future__ import annotations

import asyncio

from api.auth.service import create_project_token
from api.db.session import create_engine, session_factory
from api.settings import Settings


def project_token(database_url: str, project: str = "alpha") -> str:
    async def run() -> str:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session:
                token = await create_project_token(session, project)
                await session.commit()
                return token
        finally:
            await engine.dispose()

    return asyncio.run(run())
