"""What the steps of a dispatcher round share (admission.py, launch.py, reconcile.py): the settings,
the database, Ray, this dispatcher's name and the fencing check bound to it.

The steps take this, never the `Dispatcher` (service.py), so imports point one way: service.py
imports the steps, the steps import this module.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.dispatcher.backend import RayBackend
from api.dispatcher.leases import Held, leased, leased_many
from api.settings import Settings


@dataclass
class Backoff:
    """When something that failed for a passing reason may be tried again (a launch: Ray busy or
    unreachable, the disk, a bug; a finished attempt's final log read): after 1 s, then twice as
    long each time up to `most_s`. Per dispatcher process; the bound on the whole is the attempt's
    `launch_timeout_s` (for a log read, FINAL_LOGS_WAIT_S). Entries leave on success or failure, and
    the map is cleared past `cap` (a dispatcher that lost those jobs' leases keeps no state)."""

    most_s: float = 30.0
    cap: int = 10_000
    delays: dict[str, tuple[float, float]] = field(default_factory=dict)  # id -> (due at, last delay)

    def due(self, key: str) -> bool:
        entry = self.delays.get(key)
        return entry is None or time.monotonic() >= entry[0]

    def defer(self, key: str) -> float:
        if len(self.delays) >= self.cap:
            self.delays.clear()
        _, last = self.delays.get(key, (0.0, 0.5))
        delay = min(last * 2, self.most_s)
        self.delays[key] = (time.monotonic() + delay, delay)
        return delay

    def forget(self, key: str) -> None:
        self.delays.pop(key, None)


@dataclass
class RoundContext:
    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    ray: RayBackend
    owner: str  # this dispatcher's lease owner name
    # The cluster whose jobs these rounds admit and follow, on `ray` (each cluster is a trust domain: its
    # projects' jobs run only there); None takes every project's jobs, for a dispatcher of one Ray cluster.
    cluster_id: uuid.UUID | None = None
    cluster_name: str = "default"
    ray_down_since: float | None = None  # time.monotonic() when Ray was first found unreachable
    # When to try again: a launch (by submission id) and a finished attempt's final log read (`logs:<id>`).
    backoff: Backoff = field(default_factory=Backoff)
    errors: Counter[uuid.UUID] = field(default_factory=Counter)  # a job's rounds that raised in a row
    # Code packages found unusable (digest -> why): content-addressed, so what is wrong stays wrong;
    # the next job naming one fails without reading it again. Cleared past 1,000 entries.
    bad_code: dict[str, str] = field(default_factory=dict)
    # What each package's cache folder must hold (digest -> archive.members_digest), learnt from the
    # store by this process: a folder that holds anything else is unpacked again. Cleared past 1,000.
    code_trees: dict[str, str] = field(default_factory=dict)
    # time.monotonic() of this process's last fair-share sample: rounds between samples skip the
    # statement (another dispatcher's sample is found by the statement's own check of `sampled_at`).
    fair_share_sampled: float = float("-inf")

    def remember_bad_code(self, digest: str, why: str) -> None:
        _remember(self.bad_code, digest, why)

    def remember_code_tree(self, digest: str, tree: str) -> None:
        _remember(self.code_trees, digest, tree)

    def leased(self, job_id: uuid.UUID, submission_id: str | None = None) -> AbstractAsyncContextManager[Held | None]:
        return leased(self.sessions, job_id, self.owner, submission_id)

    def leased_many(self, submissions: Mapping[uuid.UUID, str]) -> AbstractAsyncContextManager[list[Held]]:
        return leased_many(self.sessions, submissions, self.owner)


def _remember(memo: dict[str, str], key: str, value: str, limit: int = 1000) -> None:
    """A per-dispatcher memo of packages, bounded: cleared whole past `limit` entries."""
    if len(memo) >= limit:
        memo.clear()
    memo[key] = value
