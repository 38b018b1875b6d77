"""A per-token cap on open streams, shared by the worker processes of one `trainmaster api`.

With `slots_dir` (what `trainmaster api` sets for its workers) a stream holds an exclusive `flock` on
one of the token's `per_token` slot files for its life: every worker process of this API sees the same
slots, and a process that dies frees its slots with it. Without one, the count is this process's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from api.auth.principal import Principal
from api.errors import TooManyStreams


class StreamLimiter:
    def __init__(self, per_token: int, slots_dir: str | None = None):
        self.per_token = per_token
        self.slots_dir = Path(slots_dir) if slots_dir else None
        self.open: Counter[object] = Counter()

    def _refuse(self, count: int) -> TooManyStreams:
        return TooManyStreams(
            f"this token already has {count} open streams (limit {self.per_token}); close one first",
            headers={"Retry-After": "5"},
        )

    def acquire(self, principal: Principal) -> Callable[[], None]:
        """Count a new stream for this token or refuse it (429); returns the release function."""
        key = principal.token_id or principal.project_id
        if self.slots_dir is not None:
            return self._acquire_slot(str(key))
        if self.open[key] >= self.per_token:
            raise self._refuse(self.open[key])
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

    def _acquire_slot(self, key: str) -> Callable[[], None]:
        assert self.slots_dir is not None
        self.slots_dir.mkdir(parents=True, exist_ok=True)
        for slot in range(self.per_token):
            fd = os.open(self.slots_dir / f"{key}.{slot}", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return _closer(fd)
        raise self._refuse(self.per_token)


def _closer(fd: int) -> Callable[[], None]:
    held = [fd]

    def release() -> None:
        if held:
            with contextlib.suppress(OSError):
                os.close(held.pop())  # closing the descriptor drops its lock

    return release
