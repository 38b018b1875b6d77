"""The registry of clusters: the Ray clusters the platform dispatches to. Each is a trust domain:
whoever runs code on a Ray cluster controls it, so a project is bound to one cluster, projects on one
cluster trust each other's code, and projects on different clusters share nothing but the control
plane. live.py beside it reads what a cluster has now."""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.repository import DEFAULT_CLUSTER
from api.clusters import repository, token_source
from api.db.models import ClusterRow
from api.dispatcher.backend import RayUnavailable
from api.dispatcher.ray_jobs import RayJobsBackend
from api.errors import Conflict, ValidationError
from trainmaster.models import Cluster, ClusterSpec

log = logging.getLogger("trainmaster.clusters")


class ClusterExists(Conflict):
    pass


async def create(session: AsyncSession, spec: ClusterSpec, secrets_path: str) -> ClusterRow:
    """A new cluster record; its token source must follow api/clusters/token_source.py's rule (422 naming the field)."""
    if spec.token_file is not None and spec.token_env is not None:
        raise ValidationError.field(["body", "token_env"], "give token_file or token_env, not both")
    try:
        token_source.check(spec.token_file, spec.token_env, secrets_path)
    except token_source.SourceRefused as exc:
        raise ValidationError.field(["body", exc.field], str(exc)) from exc
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


class TokenSourceRefused(RayUnavailable):
    """A record, written before the rule, whose token source api/clusters/token_source.py refuses: the cluster
    is not used until an admin moves its token; the message says where."""


def ray_token(row: ClusterRow, secrets_path: str) -> str | None:
    """The cluster's Ray token, read where its record says (a file in the secrets folder, or an
    environment variable with the reserved prefix, of the dispatcher's and the API's); None when it
    names neither or the source is empty or unreadable; `TokenSourceRefused` when the record breaks
    the rule (api/clusters/token_source.py)."""
    try:
        return token_source.read(row.token_file, row.token_env, secrets_path)
    except token_source.SourceRefused as exc:
        raise TokenSourceRefused(
            f"cluster {row.name!r} is not used: its {exc.field} breaks the rule: {exc}. Put its Ray token there "
            f"and point the record at it (UPDATE clusters SET {exc.field} = ... WHERE name = '{row.name}')"
        ) from exc
    except OSError as exc:
        log.warning("cluster_token_unreadable", extra={"cluster": row.name, "error": str(exc)})
        return None


def backend_for(row: ClusterRow, default_address: str, timeout_s: float = 10.0, *, secrets_path: str) -> RayJobsBackend:
    """The Ray Jobs API of the cluster. The cluster `default` is the process's own Ray cluster
    (TRAINMASTER_RAY_ADDRESS, and Ray's token as Ray itself finds it), so a single-cluster deployment
    needs no record; every other one is reached at its record's address with its own token
    (`TokenSourceRefused` when its record's source breaks the rule)."""
    if row.name == DEFAULT_CLUSTER:
        return RayJobsBackend(default_address, timeout_s=timeout_s)
    return RayJobsBackend(row.address, token=ray_token(row, secrets_path) or "", timeout_s=timeout_s)
