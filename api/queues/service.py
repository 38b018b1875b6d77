"""`GET /v1/queues`: each project of a cluster as its queue stands (quota, usage, borrowed, lent, fair
share, waiting jobs in admission order), read from the maintained counts and usage rows, so it costs the
same at 50,000 queued jobs as at 5."""

from __future__ import annotations

import uuid
from collections import defaultdict

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.clusters import repository as clusters
from api.dispatcher.quotas import RESOURCES, Book, Standing
from api.errors import ValidationError
from api.queues import repository
from trainmaster.models import ProjectQueue, QueuedJobInfo, Queues


async def read(session: AsyncSession, principal: Principal, cluster: str | None, limit: int) -> Queues:
    """The caller's cluster (an admin may name another)."""
    name = principal.cluster_name if cluster is None or not principal.is_admin else cluster
    found = await clusters.find(session, name)
    if found is None:
        raise ValidationError.field(["query", "cluster"], f"no cluster {name!r}")
    rows = await repository.projects_of(session, found.id)
    book = Book({row.project.id: Standing.of(row.project, row.cpus, row.gpus) for row in rows})
    lent = _lent(book)
    waits = [row.project.id for row in rows if row.waiting > 0]
    queued = await repository.first_queued(session, waits, limit)
    positions = await repository.queue_positions_of(session, [job.id for job in queued])
    jobs: dict[uuid.UUID, list[QueuedJobInfo]] = defaultdict(list)
    for job in queued:
        jobs[job.project_id].append(
            QueuedJobInfo(
                id=str(job.id),
                name=job.name,
                priority=job.priority,
                queue_position=positions.get(job.id),
                pending_reason=job.pending_reason,
            )
        )
    items = []
    for row in rows:
        standing = book.projects[row.project.id]
        items.append(
            ProjectQueue(
                project=row.project.name,
                quota=standing.quota,
                cohort=standing.cohort,
                usage=standing.usage,
                borrowed={r: amount for r in RESOURCES if (amount := standing.borrowed(r)) > 0},
                lent=lent.get(row.project.id, {}),
                waiting=row.waiting,
                fair_share=row.share,
                jobs=jobs.get(row.project.id, []),
            )
        )
    return Queues(cluster=name, items=items)


def _lent(book: Book) -> dict[uuid.UUID, dict[str, float]]:
    """What each lender's quota carries of its cohort's borrowing: the cohort's borrowed total shared
    among its members in proportion to the unused quota each lends (borrowing is not tied to one lender)."""
    lent: dict[uuid.UUID, dict[str, float]] = defaultdict(dict)
    for cohort in {s.cohort for s in book.projects.values() if s.cohort is not None}:
        members = {pid: s for pid, s in book.projects.items() if s.cohort == cohort}
        for resource in RESOURCES:
            borrowed = sum(s.borrowed(resource) for s in members.values())
            lendable = {pid: s.lendable(resource) for pid, s in members.items()}
            total = sum(lendable.values())
            if borrowed <= 0 or total <= 0:
                continue
            for pid, amount in lendable.items():
                if amount > 0:
                    lent[pid][resource] = min(amount, borrowed * amount / total)
    return lent
