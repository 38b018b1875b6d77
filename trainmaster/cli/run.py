"""`trainmaster run train.py`: ship the current folder, run the script on a gang, follow it, exit with
its outcome.

Exit codes: 0 the job succeeded, 1 it failed (or it could not be submitted: the reason is on stderr),
2 it was cancelled or timed out, 130 the view was left with the job still running.

Ctrl-C while following: on a terminal (stdin a TTY) it asks whether to cancel the job; a second Ctrl-C
(or end of input) at that question leaves the job running and prints how to follow it again. Without
a terminal (CI, a pipe, a scheduler's SIGINT) nobody can answer, so the first Ctrl-C cancels the job
and waits for it to end (exit 2); a second one stops waiting (130), the cancel already asked for.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
from rich.markup import escape

from trainmaster import config, jobfile
from trainmaster.cli.live import JobWatch
from trainmaster.cli.output import ApiUrl, Token, client_errors, console, err_console, fail, styled_status
from trainmaster.client import Client
from trainmaster.errors import ApiError, ConnectionFailed, ValidationFailed, error_from_response
from trainmaster.models import Job, JobSpec, JobStatus
from trainmaster.packing import Package, human_bytes, pack

EXIT_CODES = {JobStatus.succeeded: 0, JobStatus.failed: 1, JobStatus.cancelled: 2, JobStatus.timed_out: 2}
LEFT_RUNNING = 130  # as a shell reports a command stopped by SIGINT
UPLOAD_TIMEOUT = httpx.Timeout(300.0, connect=5.0)  # 100 MB to a busy API


def upload_unless_stored(
    package: Package, api_url: str | None, token: str | None, *, transport: httpx.BaseTransport | None = None
) -> bool:
    """Upload `package` unless the API holds its digest already (HEAD /v1/code/{digest}); True if sent.

    Its own small httpx client: `Client.upload_code` zips a folder by its own rules, not these."""
    resolved = config.resolve(api_url, token)
    headers = {"Authorization": f"Bearer {resolved.token}"} if resolved.token else {}
    with httpx.Client(base_url=resolved.api_url, headers=headers, timeout=UPLOAD_TIMEOUT, transport=transport) as http:
        try:
            if http.head(f"/v1/code/{package.digest}").status_code == 200:
                return False
            # Anything else (404; an older API without the route): send it, and let that answer speak.
            response = http.post("/v1/code", content=package.content, headers={"Content-Type": "application/zip"})
        except httpx.TransportError as exc:
            raise ConnectionFailed(
                f"cannot reach the trainmaster API at {resolved.api_url} ({exc.__class__.__name__}); "
                "is it running? (`trainmaster up` or `trainmaster api`)"
            ) from exc
    if response.status_code >= 400:
        raise error_from_response(response)
    return True


def submit_with_code(client: Client, spec: JobSpec, package: Package, api_url: str | None, token: str | None) -> Job:
    """Submit `spec` running from `package`; a package purged between the check and the submit (code
    retention) is uploaded again and the submit repeated, once."""
    try:
        return client.submit(spec).info
    except ValidationFailed as exc:
        if not any(isinstance(d, dict) and d.get("loc") == ["body", "code"] for d in exc.detail or []):
            raise
    upload_unless_stored(package, api_url, token)
    return client.submit(spec).info


def script_entry(script: str, folder: Path) -> str:
    """The entrypoint for `script` (a path from the current folder) inside the shipped `folder`."""
    path = Path(script).expanduser().resolve()
    try:
        relative = path.relative_to(folder)
    except ValueError:
        fail(f"{script} is not inside {folder}, the folder being shipped: run from the folder that holds it")
    if not path.is_file():
        fail(f"no script {script} in {folder}")
    return f"script:{relative.as_posix()}"


def run(
    script: Annotated[
        str | None, typer.Argument(help="the script every worker runs (torchrun-style), inside the current folder")
    ] = None,
    script_args: Annotated[
        list[str] | None, typer.Argument(help="the script's own arguments, after --", show_default=False)
    ] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-n", help="gang size")] = None,
    gpus_per_worker: Annotated[float | None, typer.Option(help="GPUs per worker (fractions share a GPU)")] = None,
    cpus_per_worker: Annotated[float | None, typer.Option(help="CPUs per worker")] = None,
    spec_file: Annotated[
        Path | None, typer.Option("--file", "-f", help="a job file (YAML or JSON); options override it")
    ] = None,
    name: Annotated[str | None, typer.Option(help="job name (default: the script)")] = None,
    env: Annotated[list[str], typer.Option(help="worker environment KEY=VALUE, repeatable")] = [],  # noqa: B006
    label: Annotated[list[str], typer.Option(help="KEY=VALUE, repeatable")] = [],  # noqa: B006
    timeout: Annotated[float | None, typer.Option(help="wall-clock limit in seconds")] = None,
    include_git: Annotated[bool, typer.Option("--include-git", help="ship the .git folder too")] = False,
    include_secrets: Annotated[
        bool, typer.Option("--include-secrets", help="ship .env files and private keys too")
    ] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Ship the current folder, run SCRIPT on every worker, follow its logs and metrics until it ends.

    Ships what git would (.gitignore, .trainmasterignore), never .env files or private keys.

    Exit code: 0 succeeded, 1 failed, 2 cancelled or timed out. Ctrl-C asks whether to cancel the job;
    without a terminal it cancels.
    """
    try:
        loaded = jobfile.load(spec_file) if spec_file else jobfile.JobFile(body={}, working_dir=None)
        folder = loaded.working_dir or Path.cwd().resolve()
        body = dict(loaded.body)
        body.pop("code", None)  # run ships a folder: that is the code
        entrypoint = script_entry(script, folder) if script else None
        if entrypoint is None and not str(body.get("entrypoint", "")).startswith("script:"):
            fail("give the script to run (trainmaster run train.py), or a job file with entrypoint script:…")
        body = jobfile.overridden(
            body,
            entrypoint=entrypoint,
            name=name,
            workers=workers,
            gpus_per_worker=gpus_per_worker,
            cpus_per_worker=cpus_per_worker,
            args=script_args,
            env=env,
            labels=label,
            timeout=timeout,
        )
        jobfile.validated(body)
    except jobfile.JobFileError as exc:
        fail(str(exc))
    except NotADirectoryError as exc:
        fail(str(exc))
    package = pack(folder, include_git=include_git, include_secrets=include_secrets)
    shipped = str(body["entrypoint"]).removeprefix("script:")
    if shipped not in package.files:
        fail(f"{shipped} is not shipped: .gitignore or .trainmasterignore leaves it out (or it looks like a secret)")
    for warning in package.warnings():
        err_console.print(f"[yellow]warning:[/] {escape(warning)}")
    _follow_to_the_end(body, package, api_url, token)


@client_errors
def _follow_to_the_end(body: dict[str, Any], package: Package, api_url: str | None, token: str | None) -> None:
    with Client(api_url, token) as client:
        with console.status(f"uploading {len(package.files)} files ({human_bytes(len(package.content))})…"):
            sent = upload_unless_stored(package, api_url, token)
        what = "uploaded" if sent else "already uploaded"
        console.print(f"{what} {len(package.files)} files ({human_bytes(len(package.content))}, {package.digest[:15]})")
        spec = jobfile.validated({**body, "code": package.digest})
        job = submit_with_code(client, spec, package, api_url, token)
        console.print(f"submitted [bold]{job.id[:8]}[/] ({escape(job.name)}): {styled_status(job.status)}")
        watch = JobWatch(job, lambda: Client(api_url, token))
        watch.start()
        try:
            final = _follow(client, watch)
        finally:
            watch.stop()
    reason = f": {escape(final.error)}" if final.error and final.status is not JobStatus.succeeded else ""
    console.print(f"{watch.short_id} {styled_status(final.status)}{reason}", highlight=False)
    if watch.metrics:
        console.print(f"latest metrics: {escape(watch.metrics_summary())}", highlight=False, soft_wrap=True)
    if final.status is JobStatus.failed:
        short = watch.short_id
        err_console.print(f"its output: trainmaster logs {short}  ·  details: trainmaster get {short}")
    raise typer.Exit(EXIT_CODES[final.status])


def _follow(client: Client, watch: JobWatch) -> Job:
    interactive = sys.stdin is not None and sys.stdin.isatty()
    cancel_asked = False
    while True:
        try:
            return watch.follow_logs(client, live=console.is_terminal)
        except KeyboardInterrupt:
            console.print()
        if cancel_asked:
            _leave_running(watch, cancel_asked=True)
        try:
            if not interactive or _confirm_cancel(watch):
                _cancel(client, watch)
                cancel_asked = True
        except (KeyboardInterrupt, EOFError):
            _leave_running(watch, cancel_asked=False)


def _confirm_cancel(watch: JobWatch) -> bool:
    answer = console.input(f"cancel job [bold]{watch.short_id}[/]? [y/N] (Ctrl-C again: leave it running) ")
    return answer.strip().lower() in ("y", "yes")


def _cancel(client: Client, watch: JobWatch) -> None:
    try:
        watch.job = client.cancel(watch.job.id)
    except ApiError as exc:  # it ended meanwhile: the view shows how
        if exc.status_code != 409:
            raise
    console.print(f"cancelling {watch.short_id}… (Ctrl-C again: stop waiting)")


def _leave_running(watch: JobWatch, *, cancel_asked: bool) -> NoReturn:
    state = "is being cancelled" if cancel_asked else "keeps running"
    console.print()
    console.print(
        f"{watch.short_id} {state}; follow it again: trainmaster logs -f {watch.short_id}  ·  "
        f"trainmaster metrics -f {watch.short_id}  ·  trainmaster get {watch.short_id}",
        highlight=False,
    )
    raise typer.Exit(LEFT_RUNNING)
