"""Which running jobs of a cohort give way to a waiting gang: the two pure rules of preemption inside
a cohort. preemption.py reads the candidates from the database and asks the chosen ones to go;
bench/simulate.py runs the same functions on its simulated day.

Both take the candidates cheapest first (those that checkpoint before those that never did, then the
least work since their last checkpoint, then the lowest priority: preemption._borrowing_jobs), take
only jobs that run on borrowed quota (their project holds more than its quota of a resource the job
uses), and choose nothing unless what they choose, with the free room, covers the gang.

- `reclaim`: the gang is within its project's own quota, which other members borrow: they give it
  back, whatever their share or priority.
- `fair_share`: the gang would itself borrow, and waits for resources or because
  other members borrow what its cohort would lend it. Members above it in fair share give way until
  both the free room and the cohort's lending cover it, as Kueue's fair sharing does with its
  LessThanOrEqualToFinalShare strategy: a job is taken only while its project's share without it stays
  at least the waiting project's share with the gang, so two projects never take turns preempting
  each other; the highest share gives first, and never a job of a higher priority than the gang's. A
  share is `api.queues.order.dominant_share`: the project's decayed history plus what it holds now, of the
  cluster's capacity.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import TypeVar

from api.dispatcher.quotas import EPSILON, RESOURCES, Book, Standing
from api.queues.order import Running, dominant_share, gang

Victim = TypeVar("Victim", bound=Running)


def covers(room: Mapping[str, float], need: Mapping[str, float]) -> bool:
    return all(room.get(r, 0.0) + EPSILON >= amount for r, amount in need.items())


def borrows_what(standing: Standing, usage: Mapping[str, float], victim: Running) -> bool:
    """Whether the victim's project, holding `usage`, holds beyond its quota a resource the victim uses."""
    held = gang(victim)
    quota = standing.quota
    return any(usage.get(r, 0.0) > quota[r] + EPSILON and held[r] > 0 for r in RESOURCES if r in quota)


def reclaim(job: Running, book: Book, room: Mapping[str, float], candidates: Iterable[Victim]) -> list[Victim]:
    """The borrowers' jobs to preempt so that `job`'s project gets its own quota back, cheapest first;
    empty when they cannot free enough."""
    need, free = gang(job), dict(room)
    usage: dict[uuid.UUID, dict[str, float]] = {}
    chosen: list[Victim] = []
    for victim in candidates:
        if covers(free, need):
            break
        standing = book.projects.get(victim.project_id)
        if standing is None or victim.project_id == job.project_id:
            continue
        held = usage.setdefault(victim.project_id, dict(standing.usage))
        if not borrows_what(standing, held, victim):
            continue  # its project no longer borrows what this job holds
        chosen.append(victim)
        for resource, amount in gang(victim).items():
            free[resource] = free.get(resource, 0.0) + amount
            held[resource] = held.get(resource, 0.0) - amount
    return chosen if chosen and covers(free, need) else []


def share(standing: Standing, usage: Mapping[str, float], capacity: Mapping[str, float]) -> float:
    return dominant_share(standing.history, usage, capacity)


def share_with(standing: Standing, need: Mapping[str, float], capacity: Mapping[str, float]) -> float:
    """The project's share were a gang of `need` admitted."""
    return share(standing, {r: standing.used(r) + need.get(r, 0.0) for r in RESOURCES}, capacity)


def fair_share(
    job: Running,
    book: Book,
    capacity: Mapping[str, float],
    room: Mapping[str, float],
    candidates: Iterable[Victim],
    margin: float = 0.0,
) -> list[Victim]:
    """The jobs of cohort members above `job`'s project in fair share to preempt for `job`, the highest
    share first and within a project the cheapest first; empty when they cannot free enough."""
    mine = book.projects.get(job.project_id)
    if mine is None or mine.cohort is None:
        return []
    need, free = gang(job), dict(room)
    short = book.lending_short(job.project_id, need)  # the cohort's lending, when it holds the gang too
    floor = share_with(mine, need, capacity) * (1 + margin)
    queues: dict[uuid.UUID, list[Victim]] = {}
    for victim in candidates:
        standing = book.projects.get(victim.project_id)
        if standing is None or standing.cohort != mine.cohort or victim.project_id == job.project_id:
            continue
        if victim.priority <= job.priority:
            queues.setdefault(victim.project_id, []).append(victim)
    usage = {pid: dict(book.projects[pid].usage) for pid in queues}
    chosen: list[Victim] = []
    while not covers(free, need) or any(lack > EPSILON for lack in short.values()):
        best: tuple[float, uuid.UUID, int] | None = None
        for pid, queue in queues.items():
            standing, held = book.projects[pid], usage[pid]
            for at, victim in enumerate(queue):
                without = {r: held.get(r, 0.0) - gang(victim)[r] for r in RESOURCES}
                if borrows_what(standing, held, victim) and share(standing, without, capacity) + EPSILON >= floor:
                    now = share(standing, held, capacity)
                    if best is None or now > best[0]:
                        best = (now, pid, at)
                    break  # its cheapest job that may go; a dearer one is not taken before it
        if best is None:
            return []
        _, pid, at = best
        victim = queues[pid].pop(at)
        chosen.append(victim)
        quota, held = book.projects[pid].quota, usage[pid]
        for resource, amount in gang(victim).items():
            free[resource] = free.get(resource, 0.0) + amount
            if resource in short:  # what it borrowed of this gives the cohort that much more to lend
                short[resource] -= min(amount, max(0.0, held.get(resource, 0.0) - quota.get(resource, 0.0)))
            held[resource] = held.get(resource, 0.0) - amount
    return chosen
