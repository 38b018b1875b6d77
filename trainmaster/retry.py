"""Which failures of a call are worth trying again, and after how long: shared by the waits
(`poll_until`), the event streams (`sse.follow`) and `submit`, in `Client` and `AsyncClient` alike
(the decisions here never sleep; each client sleeps its own way).

Passing failures are the API being unreachable (a refused or dropped connection, a timeout), 503 (the
API or its database restarting), 502 and 504 (a proxy in front of it) and 429 (too many streams or
requests). Anything else (401, 404, 422, …) is an answer no retry changes, and raises at once.
"""

from __future__ import annotations

import random
import time
from email.utils import parsedate_to_datetime

from trainmaster.errors import ApiError, ConnectionFailed, TooManyRequests

FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0
MAX_RETRY_AFTER_S = 300.0  # a server's Retry-After is honoured up to this long
_PASSING_STATUS = frozenset({502, 503, 504})


def is_transient(error: BaseException) -> bool:
    if isinstance(error, (ConnectionFailed, TooManyRequests)):
        return True
    return isinstance(error, ApiError) and error.status_code in _PASSING_STATUS


def delay_before_retry(error: BaseException, failures: int) -> float:
    """The server's `Retry-After` (seconds or an HTTP date) when it sent one, else an exponential
    backoff with jitter (so many clients that lost the API together do not return together)."""
    response = getattr(error, "response", None)
    header = response.headers.get("Retry-After") if response is not None else None
    asked = _retry_after_s(header) if header else None
    if asked is not None:
        return min(asked, MAX_RETRY_AFTER_S)
    backoff = min(FIRST_BACKOFF_S * 2 ** max(failures - 1, 0), MAX_BACKOFF_S)
    return backoff * random.uniform(0.5, 1.0)


def _retry_after_s(header: str) -> float | None:
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(header).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class Retries:
    """The passing failures of one call in a row, and whether to try it again: the one rule that the
    sync and async clients both follow, so that only their sleeps differ (`time.sleep`, `asyncio.sleep`).

    `delay(error)` is how long to wait before the next try, or None when the error must be raised: it is
    not passing, `max_tries` tries have failed, or the failures have lasted `give_up_after` seconds.
    `recovered()` starts counting afresh (a stream that delivered an event)."""

    def __init__(self, *, max_tries: int | None = None, give_up_after: float | None = None):
        self.max_tries = max_tries
        self.give_up_after = give_up_after
        self.failures = 0
        self._began: float | None = None

    def delay(self, error: BaseException) -> float | None:
        if not is_transient(error):
            return None
        self.failures += 1
        now = time.monotonic()
        self._began = now if self._began is None else self._began
        if self.max_tries is not None and self.failures >= self.max_tries:
            return None
        if self.give_up_after is not None and now - self._began >= self.give_up_after:
            return None
        return delay_before_retry(error, self.failures)

    def recovered(self) -> None:
        self.failures, self._began = 0, None
