"""Making room for waiting gangs, decided over a snapshot: which running jobs shrink or are preempted for
which waiting job, as data (`Room`) the round writes (preemption.apply) and bench/simulate.py runs.

`choose` takes the round's waiting outcomes in admission order and the active jobs of the cluster
(`Active`, read once per round by preemption.snapshot) and gives each waiting job that may preempt,
reclaim or preempt for fair share its targets, with the rules in preemption.py's docstring and the
pure victim rules of victims.py. It changes the snapshot as the writes will: a job chosen for one
waiting gang is asked to go and no later one chooses it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from api.dispatcher import victims
from api.dispatcher.placement import ClusterCapacity
from api.dispatcher.quotas import EPSILON, Book
from api.dispatcher.reasons import Code, Reason
from api.queues.order import gang
from api.settings import Settings
from trainmaster.models import Scaling


class Waiting(Protocol):
    """What `choose` reads of a waiting job's outcome (decide.Outcome)."""

    @property
    def job(self) -> Any: ...
    @property
    def preempt(self) -> bool: ...
    @property
    def reclaim(self) -> bool: ...
    @property
    def fair(self) -> bool: ...


@dataclass
class Active:
    """An active job of the cluster, as preemption reads it."""

    id: uuid.UUID
    project_id: uuid.UUID
    project: str  # its project's name (guaranteed shares are by name)
    priority: int
    gang_cpus: float
    gang_gpus: float
    running: bool  # running (not starting or cancelling): only running jobs are asked to go
    spec: Mapping[str, Any]
    started_at: datetime | None
    last_checkpoint_at: datetime | None
    preempted_by: uuid.UUID | None = None
    preempt_requested_at: datetime | None = None
    shrink_requested_at: datetime | None = None


@dataclass
class Room:
    """What a waiting job's room takes: elastic gangs shrunk (`shrink`: job, from, to workers) or jobs
    preempted whole (`preempt`), and why (`kind`: priority, reclaim, fair_share; `why_each` says it of
    each victim for its event); `reason` is what the waiting job shows. With nothing asked, `reason`
    says what it waits for (victims asked in an earlier round still stopping)."""

    reason: Reason
    kind: str = ""
    shrink: list[tuple[Active, int, int]] = field(default_factory=list)
    preempt: list[Active] = field(default_factory=list)
    why_each: dict[uuid.UUID, str] = field(default_factory=dict)
    purpose: str = ""  # the waiting job's `preempting` event: what for


def choose(
    waiting: Sequence[Waiting],
    active: list[Active],
    cluster: ClusterCapacity,
    book: Book,
    now: datetime,
    *,
    preemption: bool,
    grace_s: float,
    guaranteed_shares: Mapping[str, Mapping[str, float]],
    margin: float,
    admitted: Sequence[tuple[uuid.UUID, dict[str, float]]] = (),
) -> dict[uuid.UUID, Room]:
    """Each waiting job's Room, for those that may ask and found something (`Outcome.preempt`,
    `reclaim`, `fair`). `admitted`: the round's admitted gangs (project id, gang), which hold their
    room from now (priority preemption counts what projects hold with them)."""
    rooms: dict[uuid.UUID, Room] = {}
    held: dict[uuid.UUID, dict[str, float]] = {}
    for job in active:
        _add(held.setdefault(job.project_id, {"CPU": 0.0, "GPU": 0.0}), gang(job))
    for project_id, need in admitted:
        _add(held.setdefault(project_id, {"CPU": 0.0, "GPU": 0.0}), need)
    for outcome in waiting:
        job, need = outcome.job, gang(outcome.job)
        reclaim = outcome.reclaim and not book.gave_up(job.project_id, need)
        fair = outcome.fair and not book.fair_share_gave_up(job.project_id, need)
        if not (outcome.preempt or reclaim or fair):
            continue
        if (room := _already(job.id, active, now, grace_s)) is None:
            free = cluster.free()
            space = {"CPU": free.get("CPU", 0.0), "GPU": free.get("GPU", 0.0)}
            room = _cohort(job, book, cluster, space, active, fair, margin) if reclaim or fair else None
            if room is None and preemption:
                room = _priority(job, active, space, held, guaranteed_shares)
            if room is not None:
                _ask(job.id, room, now)
        if room is not None:
            rooms[job.id] = room
    return rooms


def choose_for(
    settings: Settings,
    waiting: Sequence[Waiting],
    active: list[Active],
    cluster: ClusterCapacity,
    book: Book,
    now: datetime,
    admitted: Sequence[tuple[uuid.UUID, dict[str, float]]] = (),
) -> dict[uuid.UUID, Room]:
    """`choose` with the dispatcher's settings (preemption, its grace, guaranteed shares, the margin)."""
    return choose(
        waiting,
        active,
        cluster,
        book,
        now,
        preemption=settings.preemption,
        grace_s=settings.preemption_grace_s,
        guaranteed_shares=settings.guaranteed_shares,
        margin=settings.fair_share_preemption_margin,
        admitted=admitted,
    )


def _already(job_id: uuid.UUID, active: list[Active], now: datetime, grace_s: float) -> Room | None:
    """The jobs asked to go for `job_id`, and those asked to shrink for it within `grace_s`: the room a
    shrink frees shows in Ray a moment after the smaller group started, and until then nothing more is
    asked of anyone for it."""
    recent = now - timedelta(seconds=grace_s)

    def shrinking(a: Active) -> bool:
        return a.shrink_requested_at is not None and a.shrink_requested_at > recent

    asked = [a for a in active if a.preempted_by == job_id and (a.preempt_requested_at is not None or shrinking(a))]
    if not asked:
        return None
    names = ", ".join(str(a.id)[:8] for a in asked)
    code = Code.shrinking if all(a.preempt_requested_at is None for a in asked) else Code.preempting_asked
    return Room(Reason(code, {"count": len(asked), "jobs": names}))


def _cheapest(active: list[Active], projects: set[uuid.UUID]) -> list[Active]:
    """Running jobs of `projects` not yet asked to go, cheapest to preempt first: those that checkpoint
    before those that never did, then the least work since their last checkpoint (or start), then the
    lowest priority."""
    found = [a for a in active if a.running and a.project_id in projects and a.preempt_requested_at is None]

    def cost(a: Active) -> tuple[bool, float, int, str]:
        since = a.last_checkpoint_at or a.started_at
        return (a.last_checkpoint_at is None, -(since.timestamp() if since else float("inf")), a.priority, str(a.id))

    return sorted(found, key=cost)


def _cohort(
    job: Any,
    book: Book,
    cluster: ClusterCapacity,
    space: dict[str, float],
    active: list[Active],
    fair: bool,
    margin: float,
) -> Room | None:
    """Reclaim (the job is within its project's quota, which others borrow) or fair-share preemption
    (it would borrow): victims.reclaim / victims.fair_share over the borrowers' running jobs, elastic
    ones shrunk first where that frees enough."""
    standing = book.projects[job.project_id]
    borrowing = _cheapest(active, set(book.borrowers(job.project_id)))
    need = gang(job)
    if not fair:
        why = (
            f"(project {standing.name} reclaims its quota, which this job's project borrowed in cohort "
            f"{standing.cohort})"
        )
        if (shrunk := _shrink(borrowing, dict(space), need, lambda _: why)) is not None:
            return shrunk
        chosen = victims.reclaim(job, book, space, borrowing)
        if not chosen:
            book.reclaim_failed(job.project_id, need)
            return None
        params = {"cohort": standing.cohort, "count": len(chosen), "jobs": _names(chosen)}
        return Room(
            Reason(Code.reclaiming, params),
            "reclaim",
            preempt=chosen,
            why_each={v.id: why for v in chosen},
            purpose=f"to reclaim its quota: they run on quota borrowed in cohort {standing.cohort}",
        )
    capacity = cluster.total()
    chosen = victims.fair_share(job, book, capacity, space, borrowing, margin)
    if not chosen:
        book.fair_share_failed(job.project_id, need)
        return None
    mine = victims.share_with(standing, need, capacity)

    def why_fair(victim: Active) -> str:
        theirs = book.projects[victim.project_id]
        return (
            f"(fair share in cohort {standing.cohort}: project {theirs.name} holds a share of "
            f"{victims.share(theirs, theirs.usage, capacity):.4g} of the cluster, above project {standing.name}'s "
            f"{mine:.4g} with this job)"
        )

    if (shrunk := _shrink(chosen, dict(space), need, why_fair)) is not None:
        return shrunk
    params = {"cohort": standing.cohort, "count": len(chosen), "jobs": _names(chosen), "project": standing.name}
    return Room(
        Reason(Code.preempting_fair, params),
        "fair_share",
        preempt=chosen,
        why_each={v.id: why_fair(v) for v in chosen},
        purpose=f"for fair share: their projects are above {standing.name}'s in cohort {standing.cohort}",
    )


def _priority(
    job: Any,
    active: list[Active],
    space: dict[str, float],
    held: dict[uuid.UUID, dict[str, float]],
    guaranteed_shares: Mapping[str, Mapping[str, float]],
) -> Room | None:
    """Priority preemption: lower-priority running jobs, the lowest priority first, then the most recently
    started; elastic ones shrink first where that frees enough; never below a project's guaranteed share."""
    candidates = [a for a in active if a.running and a.priority < job.priority and a.preempt_requested_at is None]
    candidates.sort(key=lambda a: (a.priority, -(a.started_at.timestamp() if a.started_at else 0.0)))

    def why(victim: Active) -> str:
        return f"(priority {job.priority} > {victim.priority})"

    need = gang(job)
    if (shrunk := _shrink(candidates, dict(space), need, why)) is not None:
        return shrunk
    chosen: list[Active] = []
    usage = {pid: dict(amounts) for pid, amounts in held.items()}
    for victim in candidates:
        if victims.covers(space, need):
            break
        share = guaranteed_shares.get(victim.project, {})
        mine = usage.setdefault(victim.project_id, {"CPU": 0.0, "GPU": 0.0})
        if any(mine[r] - gang(victim)[r] < share.get(r, 0.0) - EPSILON for r in ("CPU", "GPU")):
            continue  # within its project's guaranteed share
        chosen.append(victim)
        _add(space, gang(victim))
        _add(mine, {r: -amount for r, amount in gang(victim).items()})
    if not chosen or not victims.covers(space, need):
        return None
    return Room(
        Reason(Code.preempting, {"count": len(chosen), "jobs": _names(chosen)}),
        "priority",
        preempt=chosen,
        why_each={v.id: why(v) for v in chosen},
        purpose="to make room",
    )


def workers(job: Active, scaling: Scaling) -> int:
    """An elastic gang's size now, from what it holds (api/jobs/service.py, `resized`, keeps it so)."""
    per = scaling.worker_resources()
    resource = "CPU" if per.get("CPU", 0.0) > 0 else "GPU"
    held = job.gang_cpus if resource == "CPU" else job.gang_gpus
    return round(held / per[resource]) if per.get(resource, 0.0) > 0 else scaling.min_workers


def _shrink(
    candidates: list[Active], space: dict[str, float], need: dict[str, float], why: Callable[[Active], str]
) -> Room | None:
    """Room by shrinking elastic gangs among `candidates` (in their order) toward their `min`, before
    anything is preempted whole: each keeps running, resized from its latest checkpoint by its own
    scaling policy (workers/elastic.py reads `shrink_to`). None when shrinking them all frees too little."""
    asked: list[tuple[Active, int, int]] = []
    for victim in candidates:
        if victims.covers(space, need):
            break
        scaling = Scaling.model_validate(victim.spec.get("scaling", {}))
        if not scaling.elastic:
            continue
        size = workers(victim, scaling)
        per = scaling.worker_resources()
        target = size
        while target > scaling.min_workers and not victims.covers(space, need):
            target -= 1
            for resource in space:
                space[resource] += per.get(resource, 0.0)
        if target < size:
            asked.append((victim, size, target))
    if not asked or not victims.covers(space, need):
        return None
    params = {"count": len(asked), "jobs": ", ".join(str(v.id)[:8] for v, _, _ in asked)}
    return Room(Reason(Code.shrinking, params), "shrink", shrink=asked, why_each={v.id: why(v) for v, _, _ in asked})


def _ask(job_id: uuid.UUID, room: Room, now: datetime) -> None:
    """The snapshot as the writes will leave it: the chosen are asked for `job_id`."""
    for victim, _, _ in room.shrink:
        victim.preempted_by, victim.shrink_requested_at = job_id, now
    for victim in room.preempt:
        victim.preempted_by, victim.preempt_requested_at = job_id, now


def _names(chosen: list[Active]) -> str:
    return ", ".join(str(v.id)[:8] for v in chosen)


def _add(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    for resource, amount in amounts.items():
        into[resource] = into.get(resource, 0.0) + amount
