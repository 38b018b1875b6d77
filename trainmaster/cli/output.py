"""Rich tables and error reporting shared by the CLI commands."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from trainmaster.errors import (
    Forbidden,
    JobFailed,
    JobNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TrainmasterError,
    Unauthorized,
)
from trainmaster.models import Job, JobEvent, JobStatus

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

ApiUrl = Annotated[str | None, typer.Option("--api-url", envvar="TRAINMASTER_API_URL", help="API address")]
Token = Annotated[
    str | None, typer.Option("--token", envvar="TRAINMASTER_TOKEN", help="bearer token", show_default=False)
]


def amounts(resources: dict[str, float] | None) -> str:
    """`CPU=64,GPU=8` (a quota, holdings, borrowed, lent), `-` for none."""
    return ",".join(f"{name}={amount:g}" for name, amount in sorted((resources or {}).items())) or "-"


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def next_step(exc: TrainmasterError) -> str | None:
    """What to do about `exc`, where its own words do not say."""
    if isinstance(exc, Unauthorized):
        return (
            "give a project token: --token or TRAINMASTER_TOKEN (`trainmaster token create` makes one; "
            "`trainmaster up` writes one to ~/.trainmaster/config)"
        )
    if isinstance(exc, Forbidden):
        return (
            "this needs another token: an admin token (`trainmaster up` writes one to ~/.trainmaster/config), "
            "or one of that project"
        )
    if isinstance(exc, JobNotFound):
        return "`trainmaster ls` lists your project's jobs (a token sees its own project only)"
    if isinstance(exc, PayloadTooLarge):
        return "ship less: list data, checkpoints and outputs in .trainmasterignore"
    if isinstance(exc, ServiceUnavailable):
        return "the API is up but busy or cut off from its database: try again shortly (`trainmaster status`)"
    if isinstance(exc, JobFailed):
        return f"its output: trainmaster logs {exc.job.id[:SHORT_ID]}"
    return None


def client_errors(fn: F) -> F:
    """Show SDK errors as one clear line, and what to do next, instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrainmasterError as exc:  # JobFailed included
            hint = next_step(exc)
            fail(f"{exc}\n  next: {hint}" if hint else str(exc))

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
                gang_size(scaling),
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
        table.add_row(job_id, escape(name), styled_status(status), workers, age, escape(detail))
    return table


def gang_size(scaling: dict[str, Any]) -> str:
    """A job's workers as a column shows them: `4`, or an elastic gang's range `2-8`."""
    workers = scaling.get("num_workers", 1)
    return f"{workers.get('min')}-{workers.get('max')}" if isinstance(workers, dict) else str(workers)


def wide_jobs_table(jobs: Iterable[Job]) -> Table:
    """`ls --wide`: whole ids, names and details and a few more columns, nothing cut (wider than 80)."""
    table = Table(show_edge=False, header_style="bold", box=None, pad_edge=False, padding=(0, 2, 0, 0))
    for header in ("ID", "NAME", "STATUS", "W", "GPU/W", "PRIO", "CREATED", "RAN", "DETAIL"):
        table.add_column(header, no_wrap=True)
    for job in jobs:
        scaling = job.spec.get("scaling", {})
        gpus = (scaling.get("resources_per_worker") or {}).get("GPU", 1 if scaling.get("use_gpu") else 0)
        detail = job.pending_reason or job.error or ""
        if job.queue_position:
            detail = f"#{job.queue_position} {detail}"
        table.add_row(
            job.id,
            escape(job.name.replace("\n", " ")),
            styled_status(job.status),
            gang_size(scaling),
            f"{gpus:g}",
            str(job.spec.get("priority", 0)),
            f"{job.created_at:%Y-%m-%d %H:%M:%S}",
            ran_for(job),
            escape(detail.replace("\n", " ")),
        )
    return table


def ran_for(job: Job) -> str:
    if job.started_at is None:
        return "-"
    end = job.finished_at or datetime.now(timezone.utc)
    seconds = max(int((end - job.started_at).total_seconds()), 0)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def print_unwrapped(table: Table) -> None:
    """Print `table` at its natural width even past the terminal's (for `less -S`, grep, a wide window)."""
    natural = Measurement.get(console, console.options.update_width(100_000), table).maximum
    wide = Console(
        width=max(console.width, natural),
        file=console.file,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]  # its name is what the constructor takes
    )
    wide.print(table)


def job_detail(job: Job, events: list[JobEvent]) -> Table:
    table = Table(show_header=False, show_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("id", job.id)
    table.add_row("name", escape(job.name))
    table.add_row("project", escape(job.project))
    table.add_row("status", styled_status(job.status))
    table.add_row("entrypoint", escape(str(job.spec.get("entrypoint"))))
    table.add_row("scaling", escape(json.dumps(job.spec.get("scaling", {}))))
    table.add_row("created", f"{job.created_at:%Y-%m-%d %H:%M:%S} ({ago(job.created_at)})")
    if job.queue_position:
        table.add_row("queue position", str(job.queue_position))
    if job.goodput is not None:
        table.add_row("goodput", f"{job.goodput:.0%} of its allocated time trained")
    if job.pending_reason:
        table.add_row("pending reason", escape(job.pending_reason))
    if job.error:
        table.add_row("error", f"[red]{escape(job.error)}[/]")
    if job.latest_metrics:
        table.add_row("latest metrics", escape(json.dumps(job.latest_metrics)))
    for attempt in job.attempts:
        shown = f"{attempt.status} ({attempt.ray_submission_id}) {attempt.error or ''}"
        table.add_row(f"attempt {attempt.n}", escape(shown))
    for event in events[-10:]:
        what = event.status.value if event.status else event.kind
        repeated = f" ({event.count} times)" if event.count > 1 else ""
        table.add_row(f"{event.created_at:%H:%M:%S}", escape(f"{what}: {event.message or ''}{repeated}"))
    return table
