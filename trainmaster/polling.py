"""Waiting for something the API reports to end: `poll_until` (sync) and `poll_until_async`, shared by
`wait` on jobs and sweeps in `Client` and `AsyncClient`. Both loops follow one `Poll`, which decides;
they differ only in how they fetch and sleep."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from trainmaster.errors import TrainmasterError, WaitTimeout
from trainmaster.retry import delay_before_retry, is_transient


class HasStatus(Protocol):
    @property
    def status(self) -> enum.Enum: ...


T = TypeVar("T", bound=HasStatus)


class Poll(Generic[T]):
    """The decisions of one wait: after each answer or failure, how long to sleep before fetching again.

    A fetch that fails for a passing reason (the API unreachable, 503, 429: `trainmaster.retry`) is
    tried again after the server's Retry-After or a growing backoff, for as long as the wait lasts
    (with no `timeout`, until the API answers); any other error (401, 404, 422) raises at once. Past
    `timeout` s it raises WaitTimeout ("<what> still <status> after <timeout> s")."""

    def __init__(self, done: Callable[[T], bool], *, what: str, timeout: float | None, poll_interval: float):
        self.done, self.what, self.timeout, self.poll_interval = done, what, timeout, poll_interval
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.failures = 0
        self.state: T | None = None

    def after_answer(self, state: T) -> float | None:
        """None when `state` is the end of the wait; else the seconds to sleep."""
        self.state, self.failures = state, 0
        if self.done(state):
            return None
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise WaitTimeout(f"{self.what} still {state.status.value} after {self.timeout} s")
        return self.poll_interval

    def after_failure(self, error: TrainmasterError) -> float | None:
        """None when `error` must be raised; else the seconds to sleep."""
        if not is_transient(error):
            return None
        self.failures += 1
        delay = delay_before_retry(error, self.failures)
        if self.deadline is None:
            return delay
        left = self.deadline - time.monotonic()
        if left <= 0:
            seen = f"; last seen {self.state.status.value}" if self.state is not None else ""
            raise WaitTimeout(f"{self.what}: no answer from the API within {self.timeout} s ({error}){seen}") from error
        return min(delay, left)  # one last try at the deadline


def poll_until(
    fetch: Callable[[], T], done: Callable[[T], bool], *, what: str, timeout: float | None, poll_interval: float
) -> T:
    """Call `fetch` every `poll_interval` s until `done` holds for its answer, and return that answer
    (the rules: `Poll`)."""
    poll = Poll(done, what=what, timeout=timeout, poll_interval=poll_interval)
    while True:
        try:
            state = fetch()
        except TrainmasterError as exc:
            if (delay := poll.after_failure(exc)) is None:
                raise
        else:
            if (delay := poll.after_answer(state)) is None:
                return state
        time.sleep(delay)


async def poll_until_async(
    fetch: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    *,
    what: str,
    timeout: float | None,
    poll_interval: float,
) -> T:
    """`poll_until` for coroutines: awaits `fetch` and sleeps with asyncio."""
    poll = Poll(done, what=what, timeout=timeout, poll_interval=poll_interval)
    while True:
        try:
            state = await fetch()
        except TrainmasterError as exc:
            if (delay := poll.after_failure(exc)) is None:
                raise
        else:
            if (delay := poll.after_answer(state)) is None:
                return state
        await asyncio.sleep(delay)
