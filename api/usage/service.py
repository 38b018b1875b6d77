"""`GET /v1/usage`: who used what, how much of it trained. Figures come from ended attempts (the
trigger of migration 0017 splits each into starting, productive and lost seconds as it ends); an
attempt still running counts once it ends. A project token reads its own project; an admin every
project (or one, `project=`)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic_core
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.errors import ValidationError
from api.projects import repository as projects
from api.usage import repository

GROUPS = ("project", "user", "job")
LABEL = "label:"


async def report(
    session: AsyncSession,
    principal: Principal,
    *,
    group_by: str,
    start: datetime | None,
    end: datetime | None,
    granularity: str | None,
    project: str | None,
    limit: int,
) -> dict[str, Any]:
    """A UsageReport (trainmaster.models) as plain data, for `to_json` or `to_csv`."""
    if group_by not in GROUPS and not (group_by.startswith(LABEL) and len(group_by) > len(LABEL)):
        raise ValidationError.field(["query", "group_by"], "one of project, user, job, label:<key>")
    end = end or datetime.now(UTC)
    start = start or end - timedelta(days=30)
    if start >= end:
        raise ValidationError.field(["query", "from"], "must be before `to`")
    project_id = await _project(session, principal, project)
    if group_by in ("project", "user"):
        rows = await repository.rollup(session, group_by, start, end, granularity, project_id)
    else:
        label = group_by[len(LABEL) :] if group_by.startswith(LABEL) else None
        mine = project_id if project_id is not None else principal.project_id
        rows = await repository.by_attempts(session, label, start, end, granularity, mine, limit)
    items = [to_row(row) for row in rows]
    return {"group_by": group_by, "granularity": granularity, "start": start, "end": end, "items": items}


async def _project(session: AsyncSession, principal: Principal, name: str | None) -> Any:
    """The project the report covers: a project token's own; an admin's choice (None: all)."""
    if not principal.is_admin:
        if name is not None and name != principal.project_name:
            raise ValidationError.field(["query", "project"], "a project token reads its own project's usage")
        return principal.project_id
    if name is None:
        return None
    found = await projects.find(session, name)
    if found is None:
        raise ValidationError.field(["query", "project"], f"no project {name!r}")
    return found.project.id


def _hours(starting: float, productive: float, lost: float) -> dict[str, float]:
    starting, productive, lost = (float(x or 0) / 3600 for x in (starting, productive, lost))
    return {"allocated": starting + productive + lost, "starting": starting, "productive": productive, "lost": lost}


def to_row(row: Any) -> dict[str, Any]:
    """A UsageRow (trainmaster.models) as a plain dict: a year per project and day is 18,000 rows, and a
    model per row and per figure, validated again on the way out, cost a third of a second there."""
    key, period, attempts, queue_s, cpu_s, cpu_p, cpu_l, gpu_s, gpu_p, gpu_l = row
    cpu, gpu = _hours(cpu_s, cpu_p, cpu_l), _hours(gpu_s, gpu_p, gpu_l)
    basis = gpu if gpu["allocated"] > 0 else cpu
    return {
        "key": str(key or ""),
        "period": period,
        "attempts": int(attempts or 0),
        "cpu_hours": cpu,
        "gpu_hours": gpu,
        "queue_hours": float(queue_s or 0) / 3600,
        "goodput": basis["productive"] / basis["allocated"] if basis["allocated"] > 0 else None,
    }


PARTS = ("allocated", "starting", "productive", "lost")
CSV_COLUMNS = (
    "key",
    "period",
    "attempts",
    *(f"{kind}_hours_{part}" for kind in ("cpu", "gpu") for part in PARTS),
    "queue_hours",
    "goodput",
)


def to_json(report: dict[str, Any]) -> bytes:
    return pydantic_core.to_json(report)


# A spreadsheet runs a cell that starts with one of these as a formula (`=HYPERLINK(...)` in a user's
# name would be a link, or worse, in whoever opens the export). OWASP's rule: such a cell gets a `'`.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(cell: object) -> str:
    """`cell` as text a spreadsheet shows and never evaluates (None: an empty cell, as csv writes it)."""
    text = "" if cell is None else str(cell)
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def to_csv(report: dict[str, Any]) -> str:
    """The report as CSV; the key (a project, user, job or label value: names people chose) is
    spreadsheet-safe, the figures are numbers this function formats."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for item in report["items"]:
        hours = [item[kind][part] for kind in ("cpu_hours", "gpu_hours") for part in PARTS]
        period = item["period"].isoformat() if item["period"] else ""
        goodput = "" if item["goodput"] is None else f"{item['goodput']:.6g}"
        figures = [f"{amount:.6g}" for amount in (*hours, item["queue_hours"])]
        writer.writerow([spreadsheet_safe(item["key"]), period, item["attempts"], *figures, goodput])
    return out.getvalue()
