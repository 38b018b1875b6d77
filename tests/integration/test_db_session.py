"""The engine's pooled connections after their idle ping: handed out idle, so a session may switch
one to AUTOCOMMIT (the dispatcher marks accepted launches that way)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from api.db import session as db_session
from api.db.session import create_engine, session_factory
from api.settings import Settings


def test_a_connection_pinged_at_checkout_can_autocommit(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_session, "PING_IDLE_S", 0.0)  # every checkout pings, as after an idle second

    async def go() -> tuple[int, int]:
        engine = create_engine(Settings(database_url=database_url))
        try:
            sessions = session_factory(engine)
            async with sessions() as session:  # a connection into the pool, to be pinged next time
                await session.execute(text("SELECT 1"))
            async with sessions() as session:
                await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
                first = (await session.execute(text("SELECT pg_current_xact_id()::text::bigint"))).scalar_one()
                second = (await session.execute(text("SELECT pg_current_xact_id()::text::bigint"))).scalar_one()
                return first, second
        finally:
            await engine.dispose()

    first, second = asyncio.run(go())
    assert second != first  # each statement its own transaction: autocommit took
