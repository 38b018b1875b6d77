"""Rich tables and error reporting shared by the CLI commands."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone

from rich.console import Console
from rich.table import Table

from trainmaster.models import Job, JobEvent, JobStatus

console = Console()
err_console = Console(stderr=True)

STATUS_STYLE = {
    JobStatus.queued: "yellow",
    JobStatus.starting: "cyan",
    JobStatus.running: "bold cyan",
    JobStatus.cancelling: "magenta",
    JobStatus.succeeded: "green",
    JobStatus.failed: "bold red",
    JobStatus.cancelled: "dim",
    JobStatus.timed_out: "red",
}


def styled_status(status: JobStatus) -> str:
    return f"[{STATUS_STYLE[status]}]{status.value}[/]"


def ago(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    seconds = int((datetime.now(timezone.utc) - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"


def jobs_table(jobs: Iterable[Job]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    table.add_column("ID", no_wrap=True)
    for column in ("NAME", "STATUS", "WORKERS", "CREATED", "DETAIL"):
        table.add_column(column)
    for job in jobs:
        scaling = job.spec.get("scaling", {})
        detail = job.pending_reason or job.error or ""
        if job.queue_position:
            detail = f"#{job.queue_position} in queue: {detail}"
        table.add_row(
            job.id,
            job.name,
            styled_status(job.status),
            str(scaling.get("num_workers", 1)),
            ago(job.created_at),
            detail[:80],
        )
    return table


def job_detail(job: Job, events: list[JobEvent]) -> Table:
    table = Table(show_header=False, show_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("id", job.id)
    table.add_row("name", job.name)
    table.add_row("project", job.project)
    table.add_row("status", styled_status(job.status))
    table.add_row("entrypoint", str(job.spec.get("entrypoint")))
    table.add_row("scaling", json.dumps(job.spec.get("scaling", {})))
    table.add_row("created", f"{job.created_at:%Y-%m-%d %H:%M:%S} ({ago(job.created_at)})")
    if job.queue_position:
        table.add_row("queue position", str(job.queue_position))
    if job.pending_reason:
        table.add_row("pending reason", job.pending_reason)
    if job.error:
        table.add_row("error", f"[red]{job.error}[/]")
    if job.latest_metrics:
        table.add_row("latest metrics", json.dumps(job.latest_metrics))
    for attempt in job.attempts:
        table.add_row(f"attempt {attempt.n}", f"{attempt.status} ({attempt.ray_submission_id}) {attempt.error or ''}")
    for event in events[-10:]:
        what = event.status.value if event.status else event.kind
        table.add_row(f"{event.created_at:%H:%M:%S}", f"{what}: {event.message or ''}")
    return table
