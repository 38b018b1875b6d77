"""The `trainmaster` command line."""

from __future__ import annotations

import json
import sys
from collections import deque
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from trainmaster.cli.bench import bench_app
from trainmaster.cli.follow import follow_logs, follow_metrics, metrics_table
from trainmaster.cli.output import (
    ApiUrl,
    Token,
    client_errors,
    console,
    fail,
    job_detail,
    jobs_table,
    styled_status,
)
from trainmaster.cli.sweep import sweep_app
from trainmaster.client import Client
from trainmaster.models import JobSpec, JobStatus

app = typer.Typer(help="trainmaster: distributed PyTorch training jobs on Ray.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(sweep_app, name="sweep")


def register_plugins(target: typer.Typer) -> None:
    """Add the verbs other packages declare under the `trainmaster.cli` entry point group.

    The server verbs (`api`, `dispatcher`, `up`, `join`, `down`, `status`, `ui`, `db`, `token`) come this way from
    `api.cli`, so the SDK's CLI never imports the control plane.
    """
    for entry in entry_points(group="trainmaster.cli"):
        entry.load()(target)


JobId = Annotated[str, typer.Argument(help="a job id, or any unambiguous prefix of one (ls shows 8 characters)")]


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
    for key, value in (
        ("framework", framework),
        ("priority", priority),
        ("max_retries", max_retries),
        ("timeout_s", timeout),
    ):
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
        console.print(jobs_table(jobs, width=console.width))


@app.command()
@client_errors
def get(
    job_id: JobId,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Show one job: status, attempts, pending reason, latest events (any unambiguous id prefix)."""
    with Client(api_url, token) as client:
        job_id = client.resolve_id(job_id)
        job = client.get(job_id).info
        if output_json:
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


register_plugins(app)

if __name__ == "__main__":
    sys.exit(app())
