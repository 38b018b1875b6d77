"""Token buckets for write rates, kept in the API process's memory.

Each API process keeps its own buckets, so with several processes (uvicorn workers, replicas behind a
balancer) a rate is allowed per process: the cluster-wide ceiling is the rate times the processes. The
check costs a dictionary look-up and a few float operations, and reads nothing of another project.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass
class Bucket:
    tokens: float
    at: float  # the clock's time of `tokens`


class Buckets:
    """One bucket per key, refilled at `rate` tokens a second up to `rate * burst_s`. At most
    `max_keys` buckets are kept: the least recently used is forgotten first, and a forgotten bucket
    comes back full (which only ever allows more), so a tenant naming many keys bounds the memory it
    costs and touches no other tenant's bucket."""

    def __init__(
        self, rate: float, burst_s: float, *, max_keys: int = 100_000, clock: Callable[[], float] = time.monotonic
    ):
        self.rate = rate
        self.capacity = rate * burst_s
        self.max_keys = max_keys
        self.clock = clock
        self.buckets: OrderedDict[Hashable, Bucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def _bucket(self, key: Hashable) -> Bucket:
        now = self.clock()
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = Bucket(self.capacity, now)
            while len(self.buckets) > self.max_keys:
                self.buckets.popitem(last=False)
        else:
            self.buckets.move_to_end(key)
            bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.at) * self.rate)
            bucket.at = now
        return bucket

    def wait_s(self, key: Hashable, amount: float) -> float:
        """0 when `amount` tokens are there now, else how long until they will be (nothing is taken)."""
        if not self.enabled:
            return 0.0
        missing = amount - self._bucket(key).tokens
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, key: Hashable, amount: float) -> None:
        if self.enabled:
            self._bucket(key).tokens -= amount

    def give(self, key: Hashable, amount: float) -> None:
        """Back what a write took and did not use (a duplicate batch, a job not found)."""
        if self.enabled:
            bucket = self._bucket(key)
            bucket.tokens = min(self.capacity, bucket.tokens + amount)
