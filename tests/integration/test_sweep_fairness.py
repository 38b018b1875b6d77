"""The sweep controller serves every running sweep within a bounded number of rounds, however many run.
Sweeps are rows only: the controller never asks Ray, and these sweeps launch no trials."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Sweep
from api.db.session import create_engine, session_factory
from api.settings import Settings
from api.settings import libpq_url as libpq
from api.sweeps import controller
from tests.factories.sweeps import sweep_body

PER_ROUND = 100
OLDER = 250


def copies(database_url: str, template: str, count: int, age_s: float) -> list[str]:
    """`count` running sweeps like `template`, created `age_s` seconds ago and one second apart, with
    max_concurrent 0 so that advancing one launches nothing."""
    with psycopg.connect(libpq(database_url)) as conn:
        rows = conn.execute(
            "INSERT INTO sweeps (id, project_id, name, status, request, parameter_names, max_trials,"
            " max_concurrent, seed, created_at)"
            " SELECT gen_random_uuid(), project_id, name || '-' || n, 'running', request, parameter_names,"
            " max_trials, 0, seed, now() - make_interval(secs => %s - n)"
            " FROM sweeps, generate_series(1, %s) n WHERE id = %s RETURNING id::text",
            (age_s, count, template),
        ).fetchall()
    return [row[0] for row in rows]


def test_every_running_sweep_is_served_within_a_bounded_number_of_rounds(
    http: TestClient, auth: dict[str, str], settings: Settings, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = http.post("/v1/sweeps", json=sweep_body(), headers=auth).json()["id"]
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute("UPDATE sweeps SET status = 'cancelled' WHERE id = %s", (template,))
    older = copies(database_url, template, OLDER, age_s=3600)

    served: list[list[str]] = []
    advance = controller.advance

    async def recorded(session: AsyncSession, sweep: Sweep, principal: Any) -> None:
        served[-1].append(str(sweep.id))
        await advance(session, sweep, principal)

    monkeypatch.setattr(controller, "advance", recorded)

    async def one_round() -> int:
        served.append([])
        engine = create_engine(settings)
        try:
            return await controller.sweep_round(session_factory(engine), limit=PER_ROUND)
        finally:
            await engine.dispose()

    assert asyncio.run(one_round()) == PER_ROUND
    [newer] = copies(database_url, template, 1, age_s=0)  # created after the first round

    rounds_for_all = math.ceil((OLDER + 1) / PER_ROUND)
    while len(served) < rounds_for_all:
        asyncio.run(one_round())
    every = [sweep_id for round_ in served for sweep_id in round_]
    assert newer in every, f"the newest sweep was not served in {rounds_for_all} rounds"
    assert set(every) == {*older, newer}
    twice = {sweep_id for sweep_id in every if every.count(sweep_id) > 1}
    assert twice <= set(served[0])  # only the first served are served again, once everyone had a turn
    assert len(every) == len(twice) + OLDER + 1

    asyncio.run(one_round())  # and on: the least recently served come first
    waited_longest = set(served[0]) - twice
    assert waited_longest <= set(served[-1]) <= waited_longest | set(served[1])
