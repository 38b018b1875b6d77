"""A per-token cap on open streams in this API process."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from api.auth.service import Principal
from api.errors import TooManyStreams


class StreamLimiter:
    def __init__(self, per_token: int):
        self.per_token = per_token
        self.open: Counter[object] = Counter()

    def acquire(self, principal: Principal) -> Callable[[], None]:
        """Count a new stream for this token or refuse it (429); returns the release function."""
        key = principal.token_id or principal.project_id
        if self.open[key] >= self.per_token:
            raise TooManyStreams(
                f"this token already has {self.open[key]} open streams (limit {self.per_token}); close one first",
                headers={"Retry-After": "5"},
            )
        self.open[key] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open[key] -= 1
                if self.open[key] <= 0:
                    del self.open[key]

        return release
