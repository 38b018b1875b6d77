"""Pages bounded in bytes as well as rows.

What one request makes the API build must not grow with what a tenant stored: a list of rows whose
size a job chooses (events' data, checkpoints' metrics, log lines) is read a page at a time, a page
ending at `limit` rows or at `max_bytes` of their stored text, whichever comes first (the first row
always, so a page always moves on). PostgreSQL sums the sizes (a window over the page's keys) before
any row is loaded, and the answer says where the next page starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute


async def after_key(
    session: AsyncSession,
    model: Any,
    where: Sequence[ColumnElement[bool]],
    key: InstrumentedAttribute[int],
    size: ColumnElement[int],
    *,
    after: int,
    limit: int,
    max_bytes: int,
) -> tuple[list[Any], bool]:
    """Rows of `model` matching `where` with `key` past `after`, in `key` order: at most `limit`, and
    those whose `size` sums within `max_bytes`. With whether rows follow the page."""
    sized = (
        select(key.label("key"), size.label("size"), func.sum(size).over(order_by=key).label("running"))
        .where(*where, key > after)
        .order_by(key)
        .limit(limit)
        .subquery()
    )
    fits = select(sized.c.key).where(or_(sized.c.running <= max_bytes, sized.c.running == sized.c.size))
    rows = list((await session.execute(select(model).where(key.in_(fits)).order_by(key))).scalars())
    if not rows:
        return rows, False
    if len(rows) == limit:
        return rows, True
    following = select(key).where(*where, key > getattr(rows[-1], key.key)).limit(1)
    return rows, (await session.execute(following)).first() is not None
