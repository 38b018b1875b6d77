"""TokenCache rules that need no database: expiry, reconnects, reads that raced with a revocation."""

from __future__ import annotations

import asyncio
import uuid

from api.auth.cache import ALL, TokenCache
from api.auth.principal import Principal

WHO = Principal(project_id=uuid.uuid4(), project_name="alpha")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _synced() -> bool:
    return True


def listening(ttl_s: float = 5.0, clock: Clock | None = None) -> TokenCache:
    cache = TokenCache(ttl_s, clock=clock or Clock())
    cache.synced = _synced  # as the broker's round trip says when every earlier notice was handled
    cache.listener_up()
    return cache


def get(cache: TokenCache, token_hash: str) -> Principal | None:
    return asyncio.run(cache.get(token_hash))


def test_an_entry_is_used_only_once_the_listener_has_caught_up() -> None:
    cache = listening()
    cache.put("h", WHO, cache.stamp())

    async def behind() -> bool:
        return False

    cache.synced = behind
    assert get(cache, "h") is None


def test_an_entry_lives_for_the_ttl() -> None:
    clock = Clock()
    cache = listening(5.0, clock)
    cache.put("h", WHO, cache.stamp())
    assert get(cache, "h") == WHO
    clock.now = 5.0
    assert get(cache, "h") is None


def test_nothing_is_cached_while_not_listening_or_turned_off() -> None:
    cache = TokenCache(5.0)
    cache.put("h", WHO, cache.stamp())
    assert get(cache, "h") is None
    off = listening(0.0)
    off.put("h", WHO, off.stamp())
    assert get(off, "h") is None


def test_a_read_that_raced_with_a_revocation_or_a_reconnect_is_not_stored() -> None:
    cache = listening()
    before = cache.stamp()
    cache.revoked("someone else's hash")  # a notice arrived while the request read the database
    cache.put("h", WHO, before)
    assert get(cache, "h") is None
    before = cache.stamp()
    cache.listener_up()  # the listener reconnected meanwhile: notices may have been missed
    cache.put("h", WHO, before)
    assert get(cache, "h") is None


def test_a_reconnect_or_a_lost_listener_drops_every_entry() -> None:
    cache = listening()
    cache.put("h", WHO, cache.stamp())
    cache.listener_down()
    assert get(cache, "h") is None
    cache.listener_up()
    assert get(cache, "h") is None


def test_revocations_evict_one_hash_or_all() -> None:
    cache = listening()
    for name in ("a", "b", "c"):
        cache.put(name, WHO, cache.stamp())
    cache.revoked("a")
    assert get(cache, "a") is None and get(cache, "b") == WHO
    cache.revoked(ALL)
    assert get(cache, "b") is None and get(cache, "c") is None


def test_the_oldest_entries_go_past_the_size_limit() -> None:
    cache = TokenCache(5.0, max_entries=2, clock=Clock())
    cache.synced = _synced
    cache.listener_up()
    for name in ("a", "b", "c"):
        cache.put(name, WHO, cache.stamp())
    assert list(cache.entries) == ["b", "c"]
