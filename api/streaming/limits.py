"""Caps on open streams, per token and per project, shared by the worker processes of one `trainmaster api`.

A project mints tokens, so a cap per token alone bounds nothing: a stream counts against its token's
cap (`max_streams_per_token`) and its project's (`max_streams_per_project`), and is refused (429,
naming the cap and its setting) when either is full.

With `slots_dir` (what `trainmaster api` sets for its workers) a stream holds an exclusive `flock` on
one of its token's slot files and one of its project's for its life: every worker process of this API
sees the same slots, and a process that dies frees its slots with it. Without one, the counts are this
process's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from api.auth.principal import Principal
from api.errors import TooManyStreams

RETRY_AFTER_S = "5"


@dataclass(frozen=True)
class Cap:
    """One count a stream is held against: its slots' key, its limit, whose it is and its setting."""

    key: str
    limit: int
    whose: str
    setting: str  # TOKEN or PROJECT: TRAINMASTER_MAX_STREAMS_PER_<setting>

    def refusal(self) -> TooManyStreams:
        return TooManyStreams(
            f"{self.whose} already has {self.limit} open streams, the limit "
            f"(TRAINMASTER_MAX_STREAMS_PER_{self.setting} raises it); close one first",
            headers={"Retry-After": RETRY_AFTER_S},
        )


class StreamLimiter:
    def __init__(self, per_token: int, slots_dir: str | None = None, *, per_project: int | None = None):
        self.per_token = per_token
        self.per_project = per_project
        self.slots_dir = Path(slots_dir) if slots_dir else None
        self.open: Counter[str] = Counter()

    def acquire(self, principal: Principal) -> Callable[[], None]:
        """Count a new stream for this token and its project, or refuse it (429); returns the release
        function (calling it again does nothing)."""
        caps = [Cap(f"token-{principal.token_id or principal.project_id}", self.per_token, "this token", "TOKEN")]
        if self.per_project is not None:
            who = f"project {principal.project_name!r} (all its tokens together)"
            caps.append(Cap(f"project-{principal.project_id}", self.per_project, who, "PROJECT"))
        held: list[Callable[[], None]] = []
        try:
            for cap in caps:
                held.append(self._take(cap))
        except TooManyStreams:
            for release in held:
                release()
            raise
        return _all(held)

    def _take(self, cap: Cap) -> Callable[[], None]:
        if self.slots_dir is not None:
            return self._take_slot(cap)
        key = cap.key
        if self.open[key] >= cap.limit:
            raise cap.refusal()
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

    def _take_slot(self, cap: Cap) -> Callable[[], None]:
        assert self.slots_dir is not None
        self.slots_dir.mkdir(parents=True, exist_ok=True)
        for slot in range(cap.limit):
            fd = os.open(self.slots_dir / f"{cap.key}.{slot}", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return _closer(fd)
        raise cap.refusal()


def _all(releases: list[Callable[[], None]]) -> Callable[[], None]:
    def release() -> None:
        for each in releases:
            each()

    return release


def _closer(fd: int) -> Callable[[], None]:
    held = [fd]

    def release() -> None:
        if held:
            with contextlib.suppress(OSError):
                os.close(held.pop())  # closing the descriptor drops its lock

    return release
