"""Rich tables and error reporting shared by the CLI commands."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from trainmaster.errors import TrainmasterError
from trainmaster.models import Job, JobEvent, JobStatus

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

ApiUrl = Annotated[str | None, typer.Option("--api-url", envvar="TRAINMASTER_API_URL", help="API address")]
Token = Annotated[
    str | None, typer.Option("--token", envvar="TRAINMASTER_TOKEN", help="bearer token", show_default=False)
]


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def client_errors(fn: F) -> F:
    """Show SDK errors as one clear line instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrainmasterError as exc:  # JobFailed included
            fail(str(exc))

    return wrapper  # type: ignore[return-value]


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


SHORT_ID = 8  # like git and docker: enough to tell jobs apart, and every command takes a prefix
NAME_WIDTH = 20


def jobs_table(jobs: Iterable[Job], width: int = 80) -> Table:
    """One line per job within `width` columns (80 by default): long names and details are cut
    with an ellipsis; the detail gets whatever room the other columns leave."""
    rows = []
    for job in jobs:
        scaling = job.spec.get("scaling", {})
        detail = job.pending_reason or job.error or ""
        if job.queue_position:
            detail = f"#{job.queue_position} {detail}"
        rows.append(
            (
                job.id[:SHORT_ID],
                job.name.replace("\n", " "),
                job.status,
                str(scaling.get("num_workers", 1)),
                ago(job.created_at).removesuffix(" ago"),
                detail.replace("\n", " "),
            )
        )
    name_width = min(NAME_WIDTH, max([len("NAME")] + [len(r[1]) for r in rows]))
    fixed = [SHORT_ID, name_width, len("timed_out"), max([1] + [len(r[3]) for r in rows]), 4]
    detail_width = max(10, width - sum(fixed) - 2 * len(fixed))
    table = Table(show_edge=False, header_style="bold", box=None, pad_edge=False, padding=(0, 2, 0, 0))
    for header, size in zip(("ID", "NAME", "STATUS", "W", "AGE", "DETAIL"), [*fixed, detail_width], strict=True):
        table.add_column(header, no_wrap=True, overflow="ellipsis", max_width=size)
    for job_id, name, status, workers, age, detail in rows:
        table.add_row(job_id, name, styled_status(status), workers, age, detail)
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
        repeated = f" ({event.count} times)" if event.count > 1 else ""
        table.add_row(f"{event.created_at:%H:%M:%S}", f"{what}: {event.message or ''}{repeated}")
    return table
