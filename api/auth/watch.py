"""Whether a token that opened a long stream is still good: a revoked or expired token's open streams
end within seconds, not when the client leaves.

Checked every couple of seconds by each stream, it costs nothing while nothing changed: a revocation
reaches every API process as a NOTIFY (migration 0006) that the broker hands to the token cache, and
only when the cache saw one (or its listener is down) does the stream authenticate its token again,
which is a cache hit for every token but the revoked ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from api.auth.principal import Principal
from api.auth.service import authenticate
from api.db.unavailable import DATABASE_DOWN
from api.errors import DatabaseUnavailable, Unauthorized

if TYPE_CHECKING:
    from api.auth.cache import TokenCache
    from api.db.direct import Direct

RECHECK_S = 2.0
OUTAGE: tuple[type[Exception], ...] = (DatabaseUnavailable, OSError, *DATABASE_DOWN)


class TokenWatch:
    def __init__(
        self,
        direct: Direct,
        cache: TokenCache | None,
        authorization: str | None,
        principal: Principal,
        *,
        recheck_s: float = RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.direct = direct
        self.cache = cache
        self.authorization = authorization
        self.principal = principal
        self.recheck_s = recheck_s
        self.clock = clock
        self.seen = self._cache_state()
        self.checked_at = clock()

    def _cache_state(self) -> tuple[int, int]:
        if self.cache is None or not self.cache.listening:
            return (-1, -1)  # never equal to itself below: check the database every recheck_s
        return (self.cache.generation, self.cache.revocations)

    async def still_valid(self) -> bool:
        expires_at = self.principal.expires_at
        if expires_at is not None and time.time() >= expires_at:
            return False
        state = self._cache_state()
        if state == self.seen and state != (-1, -1):
            return True
        if self.clock() - self.checked_at < self.recheck_s:
            return True
        self.seen, self.checked_at = state, self.clock()  # taken before the read: a later notice counts
        try:
            await authenticate(self.direct, self.authorization, self.cache)
        except Unauthorized:
            return False
        except OUTAGE:
            return True  # an outage is not a revocation: the stream rides it out
        return True
