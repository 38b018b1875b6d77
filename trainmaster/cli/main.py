"""The `trainmaster` command line."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError

from trainmaster.cli.bench import bench_app
from trainmaster.cli.follow import follow_logs, follow_metrics, metrics_table
from trainmaster.cli.output import console, err_console, job_detail, jobs_table, styled_status
from trainmaster.client import Client
from trainmaster.errors import JobFailed, TrainmasterError
from trainmaster.models import JobSpec, JobStatus

app = typer.Typer(help="trainmaster: distributed PyTorch training jobs on Ray.", no_args_is_help=True)
db_app = typer.Typer(help="Database administration.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")
app.add_typer(bench_app, name="bench")

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def server_module(name: str) -> ModuleType:
    """Server-side code lives in the `api`/`workers` packages, installed with the extras."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        fail(f"{exc.name} is not installed: pip install 'trainmaster[server,workers]'")


def client_errors(fn: F) -> F:
    """Show SDK errors as one clear line instead of a traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except JobFailed as exc:
            fail(str(exc))
        except TrainmasterError as exc:
            fail(str(exc))

    return wrapper  # type: ignore[return-value]


ApiUrl = Annotated[str | None, typer.Option("--api-url", envvar="TRAINMASTER_API_URL", help="API address")]
Token = Annotated[
    str | None, typer.Option("--token", envvar="TRAINMASTER_TOKEN", help="bearer token", show_default=False)
]


# -- service commands -----------------------------------------------------------------------------


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="bind address (TRAINMASTER_API_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (TRAINMASTER_API_PORT)")] = None,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes")] = 1,
    migrate: Annotated[bool, typer.Option("--migrate", help="migrate the database first (under a lock)")] = False,
) -> None:
    """Serve the REST API."""
    server = server_module("api.cli")
    if migrate:
        server.db_upgrade("head")
    server.serve(host, port, workers)


@app.command()
def dispatcher() -> None:
    """Admit queued jobs to the Ray cluster (TRAINMASTER_RAY_ADDRESS) and follow them to the end."""
    server_module("workers.dispatcher.main").main()


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Migrate the database (TRAINMASTER_DATABASE_URL) to the latest schema."""
    server_module("api.cli").db_upgrade(revision)
    console.print(f"[green]database migrated to {revision}[/]")


@token_app.command("create")
def token_create(
    project: Annotated[str, typer.Option(help="project the token belongs to (created if new)")],
    description: Annotated[str | None, typer.Option(help="a note to recognise it by")] = None,
) -> None:
    """Print a new API token for PROJECT (stored hashed; shown only this once)."""
    token = server_module("api.cli").token_create(project, description)
    print(token)


# -- local stack ----------------------------------------------------------------------------------


@app.command()
def up(
    num_cpus: Annotated[int | None, typer.Option(help="CPUs for the Ray head (default: detected)")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="GPUs for the Ray head (default: detected)")] = None,
    api_port: Annotated[int, typer.Option(help="API port (the next free one if taken)")] = 8000,
) -> None:
    """Start the whole platform locally: PostgreSQL, a Ray head, the API and a dispatcher."""
    from trainmaster import stack

    try:
        state, started = stack.up(
            num_cpus=num_cpus, num_gpus=num_gpus, api_port=api_port, say=lambda msg: console.print(f"[dim]•[/] {msg}")
        )
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        fail(f"{exc}\n(`trainmaster down` cleans up a half-started stack)")
    console.print(
        ("[green]trainmaster is up[/]" if started else "trainmaster is already running") + f": {state.api_url}"
    )
    console.print(f"config written to {stack.client_config.config_path()}; logs in {stack.home() / 'logs'}")
    console.print("next: [bold]trainmaster submit builtin:mlp --workers 2 --follow[/]")


@app.command()
def status() -> None:
    """Health of each local component started by `trainmaster up`."""
    from rich.table import Table

    from trainmaster import stack

    components = stack.status()
    if not components:
        fail("nothing is running here: start it with `trainmaster up`")
    table = Table(show_edge=False, header_style="bold")
    for column in ("COMPONENT", "HEALTH", "DETAIL"):
        table.add_column(column)
    for name, info in components.items():
        table.add_row(name, "[green]ok[/]" if info["healthy"] else "[red]down[/]", str(info["detail"]))
    console.print(table)
    if not all(info["healthy"] for info in components.values()):
        raise typer.Exit(1)


@app.command()
def down() -> None:
    """Stop everything `trainmaster up` started (job history stays in PostgreSQL)."""
    from trainmaster import stack

    if not stack.down(say=lambda msg: console.print(f"[dim]•[/] {msg}")):
        console.print("nothing was running")
        return
    console.print("[green]stopped[/]")


# -- job commands ---------------------------------------------------------------------------------


def _parse_pairs(items: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{option} expects KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs


@app.command()
@client_errors
def submit(
    entrypoint: Annotated[str | None, typer.Argument(help="pkg.module:fn, script:train.py or builtin:NAME")] = None,
    name: Annotated[str | None, typer.Option(help="job name (default: the entrypoint)")] = None,
    spec_file: Annotated[Path | None, typer.Option("--file", "-f", help="a JobSpec as JSON")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-n", help="gang size")] = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="one GPU per worker")] = False,
    cpus_per_worker: Annotated[float | None, typer.Option(help="CPUs per worker")] = None,
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
    """Submit a training job."""
    body: dict[str, Any] = json.loads(spec_file.read_text()) if spec_file else {}
    if entrypoint:
        body["entrypoint"] = entrypoint
    if "entrypoint" not in body:
        fail("give an ENTRYPOINT or --file spec.json")
    body.setdefault("name", name or body["entrypoint"].split(":")[-1][:128])
    if name:
        body["name"] = name
    scaling = body.setdefault("scaling", {})
    if workers is not None:
        scaling["num_workers"] = workers
    if gpu:
        scaling["use_gpu"] = True
    if cpus_per_worker is not None:
        scaling.setdefault("resources_per_worker", {})["CPU"] = cpus_per_worker
    if config:
        try:
            body["config"] = json.loads(config)
        except ValueError as exc:
            fail(f"--config is not JSON: {exc}")
    if arg:
        body["args"] = arg
    body["labels"] = {**body.get("labels", {}), **_parse_pairs(label, "--label")}
    body["env"] = {**body.get("env", {}), **_parse_pairs(env, "--env")}
    for key, value in (("priority", priority), ("max_retries", max_retries), ("timeout_s", timeout)):
        if value is not None:
            body[key] = value
    try:
        spec = JobSpec.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        fail(f"invalid job spec: {problems}")
    with Client(api_url, token) as client:
        job = client.submit(spec)
        if output_json:
            print(job.info.model_dump_json(indent=2))
        else:
            console.print(f"submitted [bold]{job.id}[/] ({job.name}): {styled_status(job.status)}")
        if follow:
            follow_metrics(client, job.id)
            console.print()
        if wait or follow:
            with console.status(f"waiting for {job.id} to finish…"):
                final = job.wait()
            console.print(f"{job.id} {styled_status(final.status)}")


@app.command("ls")
@client_errors
def list_jobs(
    status: Annotated[list[JobStatus], typer.Option(help="filter by status, repeatable")] = [],  # noqa: B006
    label: Annotated[list[str], typer.Option(help="KEY=VALUE, repeatable")] = [],  # noqa: B006
    limit: Annotated[int, typer.Option(help="how many jobs")] = 20,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """List jobs, newest first."""
    with Client(api_url, token) as client:
        jobs = list(client.list(status=list(status), labels=_parse_pairs(label, "--label"), limit=limit))
    if output_json:
        print(json.dumps([job.model_dump(mode="json") for job in jobs], indent=2))
    elif not jobs:
        console.print("no jobs yet: submit one with `trainmaster submit builtin:mlp --workers 2`")
    else:
        console.print(jobs_table(jobs))


@app.command()
@client_errors
def get(
    job_id: str,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Show one job: status, attempts, pending reason, latest events."""
    with Client(api_url, token) as client:
        job = client.get(job_id).info
        if output_json:
            print(job.model_dump_json(indent=2))
            return
        console.print(job_detail(job, client.events(job_id)))


@app.command()
@client_errors
def cancel(job_id: str, api_url: ApiUrl = None, token: Token = None) -> None:
    """Cancel a job: queued jobs end at once, running ones are stopped."""
    with Client(api_url, token) as client:
        job = client.cancel(job_id)
    console.print(f"{job.id}: {styled_status(job.status)}")


@app.command()
@client_errors
def metrics(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="live view until the job ends")] = False,
    name: Annotated[list[str], typer.Option(help="only these metrics, repeatable")] = [],  # noqa: B006
    max_points: Annotated[int | None, typer.Option(help="downsample to about this many points per metric")] = None,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Show a job's metrics; -f follows them live with a trend per metric."""
    with Client(api_url, token) as client:
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
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Print a job's driver and worker output (stored: readable after the cluster is gone)."""
    with Client(api_url, token) as client:
        if follow:
            follow_logs(client, job_id)
            return
        for line in client.logs(job_id):
            console.print(line.line, markup=False, highlight=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(app())
