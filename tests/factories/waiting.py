"""One way to wait in a test: poll a predicate with a deadline, and fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.1,
    what: str = "a condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `predicate` every `interval` seconds until it answers something truthy, and return that.

    Past `timeout` seconds it raises TimeoutError naming `what` (and the last error it ignored). An
    exception of a type in `ignore` counts as "not yet" (a server restarting refuses connections);
    any other propagates at once, so a predicate can fail the wait early with its own message."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            answer = predicate()
        except ignore as exc:
            last_error = exc
        else:
            if answer:
                return answer
        if time.monotonic() > deadline:
            seen = f" (last error: {last_error!r})" if last_error is not None else ""
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(interval)
