"""TokenWatch: a stream's token is looked up again only after a revocation reached this process (or
while the listener is down), at most every recheck_s; an expired token ends the stream without a query."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from api.auth import watch as watch_module
from api.auth.cache import TokenCache
from api.auth.principal import Principal
from api.auth.watch import TokenWatch
from api.errors import Unauthorized


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each authenticate call, answering as the last item says (True: valid, False: revoked)."""
    answers = [True]

    async def authenticate(*_: Any) -> Principal:
        answers.append(answers[-1])
        if not answers[-1]:
            raise Unauthorized("revoked")
        return PRINCIPAL

    monkeypatch.setattr(watch_module, "authenticate", authenticate)
    return answers


PRINCIPAL = Principal(project_id=uuid.uuid4(), project_name="p")


def listening_cache() -> TokenCache:
    cache = TokenCache(5)
    cache.listener_up()
    return cache


def test_no_query_while_nothing_was_revoked(lookups: list[bool]) -> None:
    clock = Clock()
    watch = TokenWatch(None, listening_cache(), "Bearer x", PRINCIPAL, clock=clock)  # type: ignore[arg-type]
    for step in range(100):
        clock.now = step * 3.0
        assert asyncio.run(watch.still_valid())
    assert len(lookups) == 1  # the seed only: never asked


def test_a_revocation_is_checked_once_per_recheck_and_ends_the_stream(lookups: list[bool]) -> None:
    clock, cache = Clock(), listening_cache()
    watch = TokenWatch(None, cache, "Bearer x", PRINCIPAL, clock=clock)  # type: ignore[arg-type]
    cache.revoked("someone-elses-hash")
    clock.now = 2.0
    assert asyncio.run(watch.still_valid()) and len(lookups) == 2  # checked: still good
    lookups.append(False)  # now this token is revoked too
    cache.revoked("this-hash")
    clock.now = 3.0
    assert asyncio.run(watch.still_valid())  # within recheck_s of the last check: not yet asked
    clock.now = 4.0
    assert not asyncio.run(watch.still_valid())


def test_an_expired_token_ends_the_stream_without_a_query(lookups: list[bool]) -> None:
    expired = Principal(project_id=uuid.uuid4(), project_name="p", expires_at=time.time() - 1)
    watch = TokenWatch(None, listening_cache(), "Bearer x", expired)  # type: ignore[arg-type]
    assert not asyncio.run(watch.still_valid())
    assert len(lookups) == 1


def test_without_the_listener_the_database_is_asked_every_recheck(lookups: list[bool]) -> None:
    clock = Clock()
    watch = TokenWatch(None, TokenCache(5), "Bearer x", PRINCIPAL, clock=clock)  # type: ignore[arg-type]
    for step in range(1, 6):
        clock.now = step * 2.0
        assert asyncio.run(watch.still_valid())
    assert len(lookups) == 6
