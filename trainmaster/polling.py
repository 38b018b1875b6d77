"""Waiting for something the API reports to end: `poll_until`, shared by `Client.wait` (jobs) and
`SweepHandle.wait` (sweeps)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from trainmaster.errors import WaitTimeout


class HasStatus(Protocol):
    @property
    def status(self) -> enum.Enum: ...


T = TypeVar("T", bound=HasStatus)


def poll_until(
    fetch: Callable[[], T], done: Callable[[T], bool], *, what: str, timeout: float | None, poll_interval: float
) -> T:
    """Call `fetch` every `poll_interval` s until `done` holds for its answer, and return that answer;
    raise WaitTimeout ("<what> still <status> after <timeout> s") once `timeout` s have passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not done(state := fetch()):
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"{what} still {state.status.value} after {timeout} s")
        time.sleep(poll_interval)
    return state
