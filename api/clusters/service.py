"""Clusters: the Ray clusters the platform dispatches to, each a trust domain (DESIGN.md)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.repository import DEFAULT_CLUSTER
from api.clusters import repository
from api.db.models import Cluster as ClusterRow
from api.dispatcher.ray_jobs import RayJobsBackend
from api.errors import Conflict, ValidationError
from trainmaster.models import Cluster, ClusterSpec

log = logging.getLogger("trainmaster.clusters")


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


def ray_token(row: ClusterRow) -> str | None:
    """The cluster's Ray token, read where its record says (a file, or an environment variable of the
    dispatcher's and the API's); None when it names neither or the source is empty or unreadable."""
    if row.token_env is not None:
        return os.environ.get(row.token_env, "").strip() or None
    if row.token_file is not None:
        try:
            return Path(row.token_file).expanduser().read_text().strip() or None
        except OSError as exc:
            log.warning(json.dumps({"event": "cluster_token_unreadable", "cluster": row.name, "error": str(exc)}))
    return None


def backend_for(row: ClusterRow, default_address: str, timeout_s: float = 10.0) -> RayJobsBackend:
    """The Ray Jobs API of the cluster. The cluster `default` is the process's own Ray cluster
    (TRAINMASTER_RAY_ADDRESS, and Ray's token as Ray itself finds it), so a single-cluster deployment
    needs no record; every other one is reached at its record's address with its own token."""
    if row.name == DEFAULT_CLUSTER:
        return RayJobsBackend(default_address, timeout_s=timeout_s)
    return RayJobsBackend(row.address, token=ray_token(row) or "", timeout_s=timeout_s)
