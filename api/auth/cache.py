"""A short-lived, per-process cache of checked tokens that revocation always beats.

Checking a bearer token is a query on every request. The cache keeps who a token's hash belongs to for
`ttl_s`, but only trusts an entry while this process is listening for revocations: a trigger on
api_tokens (migration 0006) sends `NOTIFY tm_auth, '<hash>'` in the revoking transaction, and the
process's broker evicts the hash when the notice arrives. Before a cached entry is used, the broker
makes a round trip on its LISTEN connection that began after the request arrived (shared by the
requests that arrive together): PostgreSQL delivers every notice committed before that round trip
ahead of its answer, so a revocation committed before the request always wins. An entry made before
the listener last (re)connected, or whose database read raced with a revocation, is never used; with
the listener down the cache is bypassed.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from api.auth.principal import Principal

ALL = "*"
TOUCH_EVERY_S = 60.0  # last_used_at is at most this stale: one UPDATE a minute per token, not per request


async def _never() -> bool:
    return False


@dataclass(frozen=True)
class RevocationStamp:
    """The listener's state before a database read: an entry is stored only if it is unchanged after."""

    generation: int
    revocations: int


class TokenCache:
    def __init__(self, ttl_s: float, *, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self.entries: OrderedDict[str, tuple[Principal, float, int]] = OrderedDict()
        self.generation = 0  # the listener's connection, counted; 0: not listening
        self.listening = False
        self.revocations = 0
        self.hits = 0
        self.synced: Callable[[], Awaitable[bool]] = _never  # set by the broker: every earlier notice handled
        self.touched: dict[uuid.UUID, float] = {}  # token id -> when this process last wrote its last_used_at

    def due_touch(self, token_id: uuid.UUID, every_s: float = TOUCH_EVERY_S) -> bool:
        """Whether this process should write the token's last_used_at now (at most every `every_s`)."""
        now = self.clock()
        if now - self.touched.get(token_id, -every_s) < every_s:
            return False
        self.touched[token_id] = now
        if len(self.touched) > self.max_entries:
            cutoff = now - every_s
            self.touched = {key: at for key, at in self.touched.items() if at > cutoff}
        return True

    # -- the listener's side
    def listener_up(self) -> None:
        """A (new) LISTEN connection: anything cached before it may have missed a revocation."""
        self.generation += 1
        self.listening = True
        self.entries.clear()

    def listener_down(self) -> None:
        self.listening = False
        self.entries.clear()

    def revoked(self, token_hash: str) -> None:
        self.revocations += 1
        if token_hash == ALL:
            self.entries.clear()
        else:
            self.entries.pop(token_hash, None)

    # -- the request's side
    def stamp(self) -> RevocationStamp:
        return RevocationStamp(self.generation if self.listening else 0, self.revocations)

    async def get(self, token_hash: str) -> Principal | None:
        """The principal of a cached token, once every revocation committed before now is handled."""
        if self.ttl_s <= 0 or not self.listening or token_hash not in self.entries:
            return None
        if not await self.synced():
            return None
        entry = self.entries.get(token_hash)
        if entry is None:
            return None
        principal, expires, generation = entry
        if generation != self.generation or self.clock() >= expires or not self.listening:
            self.entries.pop(token_hash, None)
            return None
        self.hits += 1
        return principal

    def put(self, token_hash: str, principal: Principal, stamp: RevocationStamp) -> None:
        if self.ttl_s <= 0 or stamp.generation == 0 or stamp != self.stamp():
            return  # not listening, or a reconnect or a revocation happened during the read
        self.entries[token_hash] = (principal, self.clock() + self.ttl_s, stamp.generation)
        self.entries.move_to_end(token_hash)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)
