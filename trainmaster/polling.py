"""Waiting for something the API reports to end: `poll_until`, shared by `Client.wait` (jobs) and
`SweepHandle.wait` (sweeps)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from trainmaster.errors import TrainmasterError, WaitTimeout
from trainmaster.retry import delay_before_retry, is_transient


class HasStatus(Protocol):
    @property
    def status(self) -> enum.Enum: ...


T = TypeVar("T", bound=HasStatus)


def poll_until(
    fetch: Callable[[], T], done: Callable[[T], bool], *, what: str, timeout: float | None, poll_interval: float
) -> T:
    """Call `fetch` every `poll_interval` s until `done` holds for its answer, and return that answer;
    raise WaitTimeout ("<what> still <status> after <timeout> s") once `timeout` s have passed.

    A fetch that fails for a passing reason (the API unreachable, 503, 429: `trainmaster.retry`) is
    tried again after the server's Retry-After or a growing backoff, for as long as the wait lasts
    (with no `timeout`, until the API answers); any other error (401, 404, 422) raises at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    failures = 0
    state: T | None = None
    while True:
        try:
            state = fetch()
            failures = 0
        except TrainmasterError as exc:
            if not is_transient(exc):
                raise
            failures += 1
            delay = delay_before_retry(exc, failures)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = f"; last seen {state.status.value}" if state is not None else ""
                    raise WaitTimeout(f"{what}: no answer from the API within {timeout} s ({exc}){seen}") from exc
                delay = min(delay, left)  # one last try at the deadline
            time.sleep(delay)
            continue
        if done(state):
            return state
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"{what} still {state.status.value} after {timeout} s")
        time.sleep(poll_interval)
