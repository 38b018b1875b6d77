"""The `trainmaster` command line."""

from __future__ import annotations

import json
import sys
from collections import deque
from datetime import datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from trainmaster import jobfile
from trainmaster.cli.bench import bench_app
from trainmaster.cli.follow import follow_logs, follow_metrics, metrics_table
from trainmaster.cli.output import (
    SHORT_ID,
    ApiUrl,
    Token,
    amounts,
    client_errors,
    console,
    err_console,
    fail,
    job_detail,
    jobs_table,
    print_unwrapped,
    styled_status,
    wide_jobs_table,
)
from trainmaster.cli.run import run, submit_with_code, upload_unless_stored
from trainmaster.cli.sweep import sweep_app
from trainmaster.client import Client
from trainmaster.models import JobStatus
from trainmaster.packing import pack

app = typer.Typer(help="trainmaster: distributed PyTorch training jobs on Ray.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(sweep_app, name="sweep")
app.command()(run)


def register_plugins(target: typer.Typer) -> None:
    """Add the verbs other packages declare under the `trainmaster.cli` entry point group.

    The server verbs (`api`, `dispatcher`, `up`, `join`, `down`, `status`, `ui`, `db`, `token`) come this way from
    `api.cli`, so the SDK's CLI never imports the control plane.
    """
    for entry in entry_points(group="trainmaster.cli"):
        entry.load()(target)


JobId = Annotated[str, typer.Argument(help="a job id, or any unambiguous prefix of one (ls shows 8 characters)")]


# -- job commands ---------------------------------------------------------------------------------


@app.command()
@client_errors
def submit(
    entrypoint: Annotated[str | None, typer.Argument(help="pkg.module:fn, script:train.py or builtin:NAME")] = None,
    name: Annotated[str | None, typer.Option(help="job name (default: the entrypoint)")] = None,
    spec_file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="a job file: JobSpec fields and working_dir, YAML or JSON; options win"),
    ] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-n", help="gang size")] = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="one GPU per worker")] = False,
    gpus_per_worker: Annotated[float | None, typer.Option(help="GPUs per worker (fractions share a GPU)")] = None,
    cpus_per_worker: Annotated[float | None, typer.Option(help="CPUs per worker")] = None,
    framework: Annotated[
        str | None, typer.Option(help="torch (default), tensorflow, jax, horovod, mpi or paddle")
    ] = None,
    config: Annotated[str | None, typer.Option(help="JSON object passed to the training function")] = None,
    arg: Annotated[list[str], typer.Option("--arg", help="script argument, repeatable")] = [],  # noqa: B006
    label: Annotated[list[str], typer.Option(help="KEY=VALUE, repeatable")] = [],  # noqa: B006
    env: Annotated[list[str], typer.Option(help="worker environment KEY=VALUE, repeatable")] = [],  # noqa: B006
    priority: Annotated[int | None, typer.Option(help="-100..100, higher first")] = None,
    max_retries: Annotated[int | None, typer.Option(help="whole-job retries")] = None,
    timeout: Annotated[float | None, typer.Option(help="wall-clock limit in seconds")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the job to end")] = False,
    follow: Annotated[bool, typer.Option("--follow", help="stream the job's metrics live until it ends")] = False,
    output_json: Annotated[bool, typer.Option("--json", help="print the job as JSON")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Submit a training job (to ship the current folder and follow it: `trainmaster run`)."""
    try:
        loaded = jobfile.load(spec_file) if spec_file else jobfile.JobFile(body={}, working_dir=None)
        body = jobfile.overridden(
            loaded.body,
            entrypoint=entrypoint,
            name=name,
            workers=workers,
            gpu=gpu,
            gpus_per_worker=gpus_per_worker,
            cpus_per_worker=cpus_per_worker,
            framework=framework,
            config=config,
            args=arg,
            labels=label,
            env=env,
            priority=priority,
            max_retries=max_retries,
            timeout=timeout,
        )
        spec = jobfile.validated(body, str(spec_file) if spec_file else "job spec")
        package = pack(loaded.working_dir) if loaded.working_dir else None
    except (jobfile.JobFileError, NotADirectoryError) as exc:
        fail(str(exc))
    with Client(api_url, token) as client:
        if package is not None:
            for warning in package.warnings():
                err_console.print(f"[yellow]warning:[/] {escape(warning)}")
            upload_unless_stored(package, api_url, token)
            spec = spec.model_copy(update={"code": package.digest})
        job = submit_with_code(client, spec, package, api_url, token) if package else client.submit(spec).info
        short = job.id[:SHORT_ID]
        if output_json:
            print(job.model_dump_json(indent=2))
        else:
            name = escape(job.name)
            console.print(f"submitted [bold]{short}[/] ({name}): {styled_status(job.status)}", highlight=False)
            if not (wait or follow):
                console.print(
                    f"  follow it: trainmaster logs -f {short}  ·  trainmaster metrics -f {short}\n"
                    f"  see it:    trainmaster get {short}  ·  stop it: trainmaster cancel {short}",
                    highlight=False,
                )
        if follow:
            follow_metrics(client, job.id)
            console.print()
        if wait or follow:
            with console.status(f"waiting for {short} to finish…"):
                final = client.wait(job.id)
            console.print(f"{short} {styled_status(final.status)}")


@app.command("ls")
@client_errors
def list_jobs(
    status: Annotated[list[JobStatus], typer.Option(help="filter by status, repeatable")] = [],  # noqa: B006
    label: Annotated[list[str], typer.Option(help="KEY=VALUE, repeatable")] = [],  # noqa: B006
    limit: Annotated[int, typer.Option(help="how many jobs")] = 20,
    wide: Annotated[bool, typer.Option("--wide", "-w", help="whole ids, names and details; more columns")] = False,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """List jobs, newest first."""
    with Client(api_url, token) as client:
        try:
            labels = jobfile.parse_pairs(label, "--label")
        except jobfile.JobFileError as exc:
            fail(str(exc))
        jobs = list(client.list(status=list(status), labels=labels, limit=limit))
    if output_json:
        print(json.dumps([job.model_dump(mode="json") for job in jobs], indent=2))
    elif not jobs:
        console.print("no jobs yet: run a script with `trainmaster run train.py --workers 2`", highlight=False)
    elif wide:
        print_unwrapped(wide_jobs_table(jobs))
    else:
        console.print(jobs_table(jobs, width=console.width))


@app.command()
@client_errors
def get(
    job_id: JobId,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="yaml: a job file that submits this job again (submit -f); json: the job"),
    ] = None,
    output_json: Annotated[bool, typer.Option("--json", help="the job as JSON (same as -o json)")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Show one job: status, attempts, pending reason, latest events (any unambiguous id prefix)."""
    if output not in (None, "yaml", "json"):
        fail(f"-o takes yaml (a job file) or json, not {output!r}")
    with Client(api_url, token) as client:
        job_id = client.resolve_id(job_id)
        job = client.get(job_id).info
        if output == "yaml":
            print(jobfile.dump(job.spec), end="")
            return
        if output_json or output == "json":
            print(job.model_dump_json(indent=2))
            return
        console.print(job_detail(job, client.events(job_id)))


@app.command()
@client_errors
def cancel(job_id: JobId, api_url: ApiUrl = None, token: Token = None) -> None:
    """Cancel a job: queued jobs end at once, running ones are stopped."""
    with Client(api_url, token) as client:
        job = client.cancel(client.resolve_id(job_id))
    console.print(f"{job.id}: {styled_status(job.status)}")


@app.command()
@client_errors
def checkpoints(
    job_id: JobId,
    pin: Annotated[int | None, typer.Option(help="pin this checkpoint (its ID): kept whatever the policy")] = None,
    unpin: Annotated[int | None, typer.Option(help="unpin this checkpoint: the policy decides again")] = None,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """A job's checkpoints: step, attempt, metrics, pinned, and those deleted (with why)."""
    with Client(api_url, token) as client:
        full_id = client.resolve_id(job_id)
        for checkpoint_id, pinned in ((pin, True), (unpin, False)):
            if checkpoint_id is not None:
                client.pin_checkpoint(full_id, checkpoint_id, pinned)
        items = client.checkpoints(full_id)
    if output_json:
        print(json.dumps([item.model_dump(mode="json") for item in items], indent=2))
        return
    table = Table("ID", "STEP", "ATTEMPT", "METRICS", "KEPT", "PATH", box=None)
    for item in items:
        kept = "pinned" if item.pinned else ("deleted: " + (item.deleted_why or "") if item.deleted_at else "yes")
        shown = (str(item.id), str(item.step), str(item.attempt), json.dumps(item.metrics), kept, item.path)
        table.add_row(*map(escape, shown))
    console.print(table)


@app.command()
@client_errors
def metrics(
    job_id: JobId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="live view until the job ends")] = False,
    name: Annotated[list[str], typer.Option(help="only these metrics, repeatable")] = [],  # noqa: B006
    max_points: Annotated[int | None, typer.Option(help="downsample to about this many points per metric")] = None,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Show a job's metrics; -f follows them live with a trend per metric."""
    with Client(api_url, token) as client:
        job_id = client.resolve_id(job_id)
        if follow:
            follow_metrics(client, job_id)
            return
        points = client.metrics(job_id, names=name or None, max_points=max_points)
    if output_json:
        print(json.dumps([p.model_dump(mode="json") for p in points]))
        return
    latest: dict[str, Any] = {}
    history: dict[str, Any] = {}
    for point in points:
        if point.rank == 0:
            latest[point.name] = point
            if point.value is not None:
                history.setdefault(point.name, deque(maxlen=40)).append(point.value)
            history.setdefault(point.name, deque(maxlen=40))
    if not latest:
        console.print("no metrics yet")
        return
    console.print(metrics_table(latest, history))


@app.command()
@client_errors
def logs(
    job_id: JobId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Print a job's driver and worker output (stored: readable after the cluster is gone)."""
    with Client(api_url, token) as client:
        job_id = client.resolve_id(job_id)
        if follow:
            follow_logs(client, job_id)
            return
        for line in client.logs(job_id):
            console.print(line.line, markup=False, highlight=False, soft_wrap=True)


@app.command()
@client_errors
def queue(
    limit: Annotated[int, typer.Option(help="waiting jobs shown per project")] = 5,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """The queue of your cluster, per project: quota, what it holds, borrowed or lent, its fair share
    (smaller goes first among equal priorities), who waits and why."""
    with Client(api_url, token) as client:
        queues = client.queues(limit)
    if output_json:
        print(queues.model_dump_json(indent=2))
        return
    table = Table(show_edge=False, header_style="bold", title=f"cluster {escape(queues.cluster)}")
    for column in ("PROJECT", "QUOTA", "HOLDS", "BORROWED", "LENT", "SHARE", "WAITING"):
        table.add_column(column, overflow="fold")
    for item in queues.items:
        table.add_row(
            escape(item.project) + (f" ({escape(item.cohort)})" if item.cohort else ""),
            amounts(item.quota),
            amounts({name: amount for name, amount in item.usage.items() if amount}),
            amounts(item.borrowed),
            amounts(item.lent),
            f"{item.fair_share:.0%}",
            str(item.waiting),
        )
    console.print(table)
    for item in queues.items:
        for job in item.jobs:
            place = f"#{job.queue_position} " if job.queue_position else ""
            reason = escape(job.pending_reason or "not yet considered")
            console.print(
                f"{place}{job.id[:SHORT_ID]} {escape(item.project)}/{escape(job.name)}: {reason}", highlight=False
            )


@app.command()
@client_errors
def usage(
    group_by: Annotated[str, typer.Option(help="project, user, job or label:<key>")] = "project",
    start: Annotated[datetime | None, typer.Option("--from", help="default: 30 days ago")] = None,
    end: Annotated[datetime | None, typer.Option("--to", help="default: now")] = None,
    granularity: Annotated[str | None, typer.Option(help="hour or day: one row per period")] = None,
    project: Annotated[str | None, typer.Option(help="one project (admin token)")] = None,
    output_csv: Annotated[bool, typer.Option("--csv", help="CSV, as the server writes it")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Who used what: CPU- and GPU-hours of ended attempts (productive, starting, lost), queue time, goodput."""
    query: dict[str, Any] = {
        "group_by": group_by,
        "start": start,
        "end": end,
        "granularity": granularity,
        "project": project,
    }
    with Client(api_url, token) as client:
        if output_csv:
            sys.stdout.write(client.usage(**query, csv=True))
            return
        report = client.usage(**query)
    table = Table(show_edge=False, header_style="bold")
    columns = [group_by.upper()] + (["PERIOD"] if granularity else [])
    for column in (*columns, "GPU-H", "CPU-H", "PRODUCTIVE", "LOST", "QUEUED-H", "GOODPUT"):
        table.add_column(column, overflow="fold")
    for row in report.items:
        basis = row.gpu_hours if row.gpu_hours.allocated > 0 else row.cpu_hours
        period = [row.period.strftime("%Y-%m-%d %H:00")] if granularity and row.period else []
        table.add_row(
            escape(row.key[:SHORT_ID] if group_by == "job" else row.key or "-"),
            *period,
            f"{row.gpu_hours.allocated:.2f}",
            f"{row.cpu_hours.allocated:.2f}",
            f"{basis.productive:.2f}",
            f"{basis.lost:.2f}",
            f"{row.queue_hours:.2f}",
            "-" if row.goodput is None else f"{row.goodput:.0%}",
        )
    console.print(table if report.items else "no attempt ended in that range")


register_plugins(app)

if __name__ == "__main__":
    sys.exit(app())
