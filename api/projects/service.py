"""Projects: each bound to one cluster (its trust domain), its jobs' priority at most `max_priority`,
what its jobs hold bounded by its quota and cohort (api/dispatcher/quotas.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.clusters import repository as clusters
from api.db.models import ClusterRow
from api.errors import Conflict, NotFound, ValidationError
from api.projects import repository
from trainmaster.models import Project, ProjectPatch, ProjectSpec

QUOTA_FIELDS = ("quota", "cohort", "borrowing_limit", "lending_limit")
CLEARABLE = (*QUOTA_FIELDS[1:], "checkpoint_retention_days", "storage_quota_bytes")  # given as null: cleared


class ProjectExists(Conflict):
    pass


class ProjectNotFound(NotFound):
    pass


async def _cluster(session: AsyncSession, name: str) -> ClusterRow:
    cluster = await clusters.find(session, name)
    if cluster is None:
        raise ValidationError.field(["body", "cluster"], f"no cluster {name!r}: add it with POST /v1/clusters")
    return cluster


async def create(session: AsyncSession, spec: ProjectSpec) -> Project:
    cluster = await _cluster(session, spec.cluster)
    values = spec.model_dump(include={*QUOTA_FIELDS, "max_priority", *CLEARABLE})
    if not await repository.insert_new(session, spec.name, cluster.id, values):
        raise ProjectExists(f"a project named {spec.name!r} exists")
    return await read(session, None, spec.name)


async def read(session: AsyncSession, principal: Principal | None, name: str) -> Project:
    """One project: an admin (or no principal: the service itself) any, a project token its own."""
    found = await repository.find(session, name)
    if found is None or (principal is not None and not principal.is_admin and found.project.id != principal.project_id):
        raise ProjectNotFound(f"no project {name!r}")
    return to_wire(found)


async def list_visible(session: AsyncSession, principal: Principal) -> list[Project]:
    rows = await repository.list_all(session, None if principal.is_admin else principal.project_id)
    return [to_wire(found) for found in rows]


async def change(session: AsyncSession, name: str, patch: ProjectPatch) -> Project:
    found = await repository.find(session, name)
    if found is None:
        raise ProjectNotFound(f"no project {name!r}")
    values: dict[str, Any] = {}
    if patch.cluster is not None:
        values["cluster_id"] = (await _cluster(session, patch.cluster)).id
    if patch.max_priority is not None:
        values["max_priority"] = patch.max_priority
    if patch.quota is not None:
        values["quota"] = patch.quota
    # Given as null, these are cleared (left out, they stay).
    values.update(patch.model_dump(include=set(CLEARABLE) & patch.model_fields_set))
    if values:
        await repository.change(session, found.project.id, values)
    return await read(session, None, name)


def to_wire(found: repository.Found) -> Project:
    row = found.project
    return Project(
        name=row.name,
        cluster=found.cluster,
        max_priority=row.max_priority,
        created_at=row.created_at,
        quota=row.quota,
        cohort=row.cohort,
        borrowing_limit=row.borrowing_limit,
        lending_limit=row.lending_limit,
        usage=found.usage,
        checkpoint_retention_days=row.checkpoint_retention_days,
        storage_quota_bytes=row.storage_quota_bytes,
    )
