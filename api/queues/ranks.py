"""A per-process cache of each queued job's place among its own project's queue, exact by invalidation.

A job's queue position (sql.READ_JOB) needs the queued jobs of its own project and priority older than
it, counted with their gangs (its progressive share): an index-only scan of up to the whole queue, on
every poll of every queued job. That count and those sums ("older", `Older` below) change only when a job of
the same project and priority, older than it or itself, enters or leaves the queue; a new submission, the
newest of its group, changes no older job's.

So each API process keeps the count per job, and forgets it when it may have changed: the jobs
trigger (migration 0008) sends `NOTIFY tm_queue, '<project> <priority> <created µs> <id>'` for every
job that enters or leaves the queue, from whatever writes it (submission, admission, cancellation, a
retry put back, a priority changed by hand, a TRUNCATE sends '*'), and the broker hands each notice to
`moved`, which drops the cached counts of that group at or after that job in queue order.

Exact, not eventually right:
- a cached count is used only after a round trip on the LISTEN connection that began after the request
  arrived (`synced_since`, shared with the token cache's), so every change committed before the request
  has been applied;
- a count read from the database is stored and then the notices that arrived while it was read are
  applied to it (they may be older than the read's snapshot; dropping more than needed is harmless),
  and a notice committed after the read arrives later and drops it;
- everything is dropped when the LISTEN connection is lost or made again, and nothing is stored or used
  while it is down.
A group found with nothing cached is read whole, once (`warm`): one index scan numbers every queued job
of the group, instead of one count per job polled.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Group = tuple[str, int]  # (project id, priority)
Place = tuple[int, str]  # (created_at in µs since the epoch, job id): queue order within a group
Older = tuple[int, int, int]  # the group's queued jobs ahead of one, and their CPUs and GPUs in millis


async def _never(_since: float) -> bool:
    return False


@dataclass
class _Counts:
    places: list[Place] = field(default_factory=list)  # sorted
    older: dict[str, Older] = field(default_factory=dict)  # job id -> the group's queued jobs ahead of it


@dataclass(frozen=True)
class Stamp:
    """The listener's state before a database read: what arrived after it is applied to what is stored."""

    generation: int
    notices: int


class QueueRanks:
    def __init__(self, max_entries: int = 200_000, *, recent: int = 4096):
        self.max_entries = max_entries
        self.groups: dict[Group, _Counts] = {}
        self.group_of: dict[str, Group] = {}
        self.generation = 0  # the listener's connection, counted
        self.listening = False
        self.notices = 0  # notices handled, counted
        self.recent: deque[tuple[int, Group, Place]] = deque(maxlen=recent)  # (number, group, place)
        self.hits = 0
        self.misses = 0
        self.warms = 0
        self.synced_since: Callable[[float], Awaitable[bool]] = _never  # set by the broker

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    # -- the listener's side
    def listener_up(self) -> None:
        self.generation += 1
        self.listening = True
        self._clear()

    def listener_down(self) -> None:
        self.listening = False
        self._clear()

    def moved(self, payload: str) -> None:
        """A job entered or left its group's queue (the trigger's notice, or '*' for all)."""
        self.notices += 1
        try:
            project, priority, created_us, job_id = payload.split(" ")
            group, place = (project, int(priority)), (int(created_us), job_id)
        except ValueError:  # '*' (TRUNCATE), or a notice this version cannot read: forget everything
            self.recent.clear()  # and a read that spans it is not stored (see `_replay`)
            self._clear()
            return
        self.recent.append((self.notices, group, place))
        self._drop_from(group, place)

    # -- the request's side
    def stamp(self) -> Stamp:
        return Stamp(self.generation if self.listening else 0, self.notices)

    def cold(self, project_id: str, priority: int) -> bool:
        return self.enabled and self.listening and (project_id, priority) not in self.groups

    async def older(self, job_id: str, arrived: float) -> Older | None:
        """The cached count for a job, once every notice committed before `arrived` is handled."""
        if not self.enabled or not self.listening or job_id not in self.group_of:
            self.misses += 1
            return None
        group = self.group_of.get(job_id) if await self.synced_since(arrived) else None
        if group is None:  # not caught up, or dropped by a notice handled meanwhile
            self.misses += 1
            return None
        self.hits += 1
        return self.groups[group].older[job_id]

    def put(
        self, project_id: str, priority: int, rows: list[tuple[int, str, Older]], stamp: Stamp, *, whole: bool = False
    ) -> None:
        """Counts read after `stamp`: (created µs, job id, older) of jobs of one group; `whole`: its head
        numbered at once (counted as a warm)."""
        self.warms += whole
        if not self.enabled or stamp.generation == 0 or stamp.generation != self.generation or not self.listening:
            return
        if len(self.group_of) + len(rows) > self.max_entries:
            self._clear()
            if len(rows) > self.max_entries:
                return
        group = (project_id, priority)
        counts = self.groups.setdefault(group, _Counts())
        for created_us, job_id, older in rows:
            if job_id in counts.older:
                continue
            bisect.insort(counts.places, (created_us, job_id))
            counts.older[job_id] = older
            self.group_of[job_id] = group
        self._replay(group, stamp)

    # -- inside
    def _replay(self, group: Group, stamp: Stamp) -> None:
        """Apply to `group` the notices handled since `stamp` (all of it when some are no longer kept)."""
        missed = self.notices - stamp.notices
        if missed == 0:
            return
        if missed > len(self.recent) or (self.recent and self.recent[0][0] > stamp.notices + 1):
            self._drop_group(group)
            return
        for number, moved_group, place in self.recent:
            if number > stamp.notices and moved_group == group:
                self._drop_from(group, place)

    def _drop_from(self, group: Group, place: Place) -> None:
        counts = self.groups.get(group)
        if counts is None:
            return
        cut = bisect.bisect_left(counts.places, place)
        for _, job_id in counts.places[cut:]:
            del counts.older[job_id]
            del self.group_of[job_id]
        del counts.places[cut:]
        if not counts.places:
            del self.groups[group]

    def _drop_group(self, group: Group) -> None:
        counts = self.groups.pop(group, None)
        if counts is not None:
            for job_id in counts.older:
                del self.group_of[job_id]

    def _clear(self) -> None:
        self.groups.clear()
        self.group_of.clear()
