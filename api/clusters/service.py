"""Clusters: the Ray clusters the platform dispatches to, each a trust domain (DESIGN.md)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from api.clusters import repository
from api.db.models import Cluster as ClusterRow
from api.errors import Conflict, ValidationError
from trainmaster.models import Cluster, ClusterSpec


class ClusterExists(Conflict):
    pass


async def create(session: AsyncSession, spec: ClusterSpec) -> ClusterRow:
    if spec.token_file is not None and spec.token_env is not None:
        raise ValidationError.field(["body", "token_env"], "give token_file or token_env, not both")
    row = await repository.insert_new(session, spec.model_dump())
    if row is None:
        raise ClusterExists(f"a cluster named {spec.name!r} exists")
    return row


async def list_all(session: AsyncSession) -> list[Cluster]:
    return [to_wire(row) for row in await repository.list_all(session)]


def to_wire(row: ClusterRow) -> Cluster:
    return Cluster(
        name=row.name,
        address=row.address,
        token_file=row.token_file,
        token_env=row.token_env,
        labels=row.labels,
        created_at=row.created_at,
    )
