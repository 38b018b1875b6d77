from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Cluster


async def find(session: AsyncSession, name: str) -> Cluster | None:
    return (await session.execute(select(Cluster).where(Cluster.name == name))).scalar_one_or_none()


async def list_all(session: AsyncSession) -> Sequence[Cluster]:
    return (await session.execute(select(Cluster).order_by(Cluster.name))).scalars().all()


async def insert_new(session: AsyncSession, values: dict[str, Any]) -> Cluster | None:
    """The new cluster, or None when the name is taken."""
    inserted = await session.execute(
        insert(Cluster).values(**values).on_conflict_do_nothing(index_elements=["name"]).returning(Cluster.id)
    )
    if inserted.scalar_one_or_none() is None:
        return None
    return await find(session, values["name"])
