"""The checkpoint collector's pass, run once as the dispatcher runs it, on an engine of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

from api.db.session import create_engine, session_factory
from api.dispatcher.checkpoint_collector import Collected, collect
from api.settings import Settings


def run_collector(database_url: str, storage: Path | str) -> Collected:
    async def go() -> Collected:
        engine = create_engine(Settings(database_url=database_url))
        try:
            return await collect(session_factory(engine), str(storage))
        finally:
            await engine.dispose()

    return asyncio.run(go())
