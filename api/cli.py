"""Server-side verbs of the `trainmaster` command: `api`, `dispatcher`, `db upgrade`, `token create`,
`up`, `join`, `status`, `down`, `ui`; and, through trainmaster/cli/admin.py, the REST verbs `cluster`,
`project` and `token ls|revoke`.

The SDK's CLI (`trainmaster.cli.main`) imports nothing from this package: it finds `register`
through the `trainmaster.cli` entry point declared in pyproject.toml. This module imports only typer
and the SDK at load time, so `trainmaster --help` works without the server extras; each command
imports what it needs when it runs and says which extra to install when that is missing.
"""

from __future__ import annotations

import importlib
import subprocess
from types import ModuleType
from typing import Annotated

import typer

from trainmaster.cli.output import console, err_console


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _server(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise _fail(f"{exc.name} is not installed: pip install 'trainmaster[server,workers]'") from exc


def register(app: typer.Typer) -> None:
    """Add the server verbs to the `trainmaster` command."""
    db_app = typer.Typer(help="Database administration.", no_args_is_help=True)
    token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
    app.add_typer(db_app, name="db")
    app.add_typer(token_app, name="token")
    app.command()(api)
    app.command()(dispatcher)
    app.command()(up)
    app.command()(join)
    app.command()(status)
    app.command()(down)
    app.command()(ui)
    db_app.command("upgrade")(db_upgrade)
    token_app.command("create")(token_create)
    # cluster add|ls, project create|ls|set, token ls|revoke: REST calls, SDK only (trainmaster/cli/admin.py)
    importlib.import_module("trainmaster.cli.admin").register(app, token_app)


def api(
    host: Annotated[str | None, typer.Option(help="bind address (TRAINMASTER_API_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="port (TRAINMASTER_API_PORT)")] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="worker processes (default: one per CPU core, at most 8)")
    ] = None,
    migrate: Annotated[bool, typer.Option("--migrate", help="migrate the database first (under a lock)")] = False,
    access_log: Annotated[bool, typer.Option("--access-log", help="log every request (Prometheus counts them)")] = (
        False
    ),
) -> None:
    """Serve the REST API.

    Several worker processes share the port; each has its own LISTEN connection (streams, token
    revocations) and database pool, and the per-token stream cap is counted across all of them.
    """
    import os
    import tempfile

    from trainmaster import json_logs

    uvicorn = _server("uvicorn")
    # Before the settings are read: the workers share one directory of stream slots (api/streaming/limits.py).
    slots = None if "TRAINMASTER_STREAM_SLOTS_DIR" in os.environ else tempfile.mkdtemp(prefix="trainmaster-streams-")
    if slots is not None:
        os.environ["TRAINMASTER_STREAM_SLOTS_DIR"] = slots
    settings = _server("api.settings").get_settings()
    if migrate:
        _server("api.db.migrate").upgrade(settings.migration_database_url or settings.database_url, "head")
    uvicorn.run(
        "api.app:app_factory",
        factory=True,
        host=host or settings.api_host,
        port=port or settings.api_port,
        workers=workers or min(os.cpu_count() or 1, 8),
        loop="uvloop",
        http="httptools",
        access_log=access_log,
        log_config=json_logs.uvicorn_config(),  # applied in every worker: JSON lines, uvicorn's own included
        log_level="info",
        timeout_graceful_shutdown=5,
        # uvicorn kills a worker that does not answer its supervisor's ping within this (5 s by default) and
        # starts another. A worker answers from a thread it starts only once its interpreter is up: on a
        # loaded machine that took longer, so each new worker was killed in turn and the API never became
        # ready (a CI rehearsal's `trainmaster up`: "Child process died", then 60 s without an answer).
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
    )
    if slots is not None:
        import shutil

        shutil.rmtree(slots, ignore_errors=True)


WORKER_HEALTHCHECK_S = 30  # how long an API worker may take to answer uvicorn's supervisor (see `api`)


def dispatcher() -> None:
    """Admit queued jobs to the Ray cluster (TRAINMASTER_RAY_ADDRESS) and follow them to the end."""
    _server("api.dispatcher.main").main()


def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Migrate the database to the latest schema, as its owner: TRAINMASTER_MIGRATION_DATABASE_URL, else
    TRAINMASTER_DATABASE_URL."""
    settings = _server("api.settings").get_settings()
    _server("api.db.migrate").upgrade(settings.migration_database_url or settings.database_url, revision)
    console.print(f"[green]database migrated to {revision}[/]")


def token_create(
    project: Annotated[str, typer.Option(help="project the token belongs to (created on cluster default if new)")],
    scope: Annotated[str, typer.Option(help="admin, project or metrics")] = "project",
    expires_in: Annotated[
        str | None, typer.Option(help="life: 90d, 12h, 30m, or never (default: 90d for project tokens, else never)")
    ] = None,
    user: Annotated[str | None, typer.Option(help="who holds it")] = None,
    description: Annotated[str | None, typer.Option(help="a note to recognise it by")] = None,
) -> None:
    """Print a new API token for PROJECT (stored hashed; shown only this once), made in the database
    (TRAINMASTER_DATABASE_URL): how the first admin token comes to be. With an admin token, the API
    does the same: POST /v1/tokens."""
    from trainmaster.admin import parse_duration

    if scope not in ("admin", "project", "metrics"):
        raise _fail(f"--scope is admin, project or metrics, not {scope!r}")
    try:
        life = parse_duration(expires_in) if expires_in is not None else None
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    never = expires_in is not None and life is None
    scopes = _server("api.auth.principal").Scope
    database_url = _server("api.settings").get_settings().database_url
    secret = _server("api.auth.admin").token(
        database_url,
        project,
        scope=scopes(scope),
        description=description,
        expires_in=life,
        never=never,
        user_name=user,
    )
    print(secret)


def up(
    num_cpus: Annotated[int | None, typer.Option(help="CPUs for the Ray head (default: detected)")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="GPUs for the Ray head (default: detected)")] = None,
    api_port: Annotated[int, typer.Option(help="API port (the next free one if taken)")] = 8000,
    nodes: Annotated[int, typer.Option(min=1, help="Ray nodes on this machine: the head and N-1 workers")] = 1,
    cpus_per_node: Annotated[float, typer.Option(min=0, help="CPUs of each extra worker node")] = 1.0,
    resources: Annotated[
        str | None, typer.Option(help='custom resources of each worker node, JSON: {"ssd": 1}')
    ] = None,
    node_ip: Annotated[str, typer.Option(help="this machine's address for Ray (set it for other machines to join)")] = (
        "127.0.0.1"
    ),
    labels: Annotated[
        list[str],
        typer.Option(help="node labels, KEY=VALUE[,...], once per node in order (the head first): rack=a"),
    ] = [],  # noqa: B006
    clusters: Annotated[
        int, typer.Option(min=1, max=8, help="Ray clusters on this machine: default and cluster-2 … cluster-N")
    ] = 1,
    cpus_per_cluster: Annotated[int, typer.Option(min=1, help="CPUs of each extra cluster's head")] = 2,
) -> None:
    """Start the whole platform locally: PostgreSQL, a Ray head (and worker nodes), the API and a dispatcher."""
    stack = _server("api.stack.local")
    node_labels = [_labels(text) for text in labels]
    try:
        state, started = stack.up(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            api_port=api_port,
            nodes=nodes,
            cpus_per_node=cpus_per_node,
            node_resources=_json_resources(resources, "--resources"),
            node_ip=node_ip,
            node_labels=node_labels,
            clusters=clusters,
            cpus_per_cluster=cpus_per_cluster,
            say=lambda msg: console.print(f"[dim]•[/] {msg}"),
        )
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        raise _fail(f"{exc}\n(`trainmaster down` cleans up a half-started stack)") from exc
    console.print(
        ("[green]trainmaster is up[/]" if started else "trainmaster is already running") + f": {state.api_url}"
    )
    console.print(f"config written to {stack.client_config.config_path()}; logs in {stack.home() / 'logs'}")
    console.print("next: [bold]trainmaster submit builtin:mlp --workers 2 --follow[/]")
    console.print(f"add a machine: {stack.join_line(state)}")
    for cluster in state.clusters:
        console.print(
            f"cluster {cluster['name']}: {cluster['dashboard']}; bind a project to it: "
            f"[bold]trainmaster project create NAME --cluster {cluster['name']}[/]"
        )


def join(
    address: Annotated[str, typer.Argument(help="the head's GCS address, host:port (`trainmaster up` prints it)")],
    token: Annotated[str | None, typer.Option(help="the cluster's Ray token", envvar="RAY_AUTH_TOKEN")] = None,
    token_file: Annotated[str | None, typer.Option(help="a file holding the cluster's Ray token")] = None,
    num_cpus: Annotated[float | None, typer.Option(help="CPUs to offer (default: detected)")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="GPUs to offer (default: detected)")] = None,
    resources: Annotated[str | None, typer.Option(help='custom resources, JSON: {"ssd": 1}')] = None,
    node_ip: Annotated[str | None, typer.Option(help="this machine's address, as the head reaches it")] = None,
    labels: Annotated[str | None, typer.Option(help="node labels, KEY=VALUE[,...]: rack=r1,block=b2")] = None,
) -> None:
    """Add this machine to a trainmaster Ray cluster as a worker node (token auth on)."""
    from pathlib import Path

    if token is None and token_file is None:
        raise _fail("give --token or --token-file (on the head: ~/.trainmaster/ray_auth_token)")
    secret = token if token is not None else Path(token_file or "").expanduser().read_text()
    stack = _server("api.stack.local")
    try:
        command = stack.join(
            address,
            secret,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources=_json_resources(resources, "--resources"),
            node_ip=node_ip,
            labels=_labels(labels) if labels else None,
        )
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        raise _fail(f"{exc}\n(check that {address} is reachable from here and the token is the head's)") from exc
    console.print(f"[green]joined[/] {address}; `trainmaster down` takes this machine out again")
    console.print("[dim]the same by hand: RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<token> " + " ".join(command[1:]) + "[/]")


def _labels(text: str) -> dict[str, str]:
    from api.stack.ray_head import parse_labels

    try:
        return parse_labels(text)
    except ValueError as exc:
        raise _fail(f"--labels: {exc}") from exc


def _json_resources(raw: str | None, option: str) -> dict[str, float] | None:
    if raw is None:
        return None
    import json

    try:
        parsed = json.loads(raw)
        return {str(name): float(amount) for name, amount in parsed.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise _fail(f'{option} expects a JSON object of numbers, e.g. {{"ssd": 1}}: {exc}') from exc


def status() -> None:
    """Health of each local component started by `trainmaster up`."""
    from rich.table import Table

    components = _server("api.stack.local").status()
    if not components:
        raise _fail("nothing is running here: start it with `trainmaster up`")
    table = Table(show_edge=False, header_style="bold")
    for column in ("COMPONENT", "HEALTH", "DETAIL"):
        table.add_column(column)
    for name, info in components.items():
        table.add_row(name, "[green]ok[/]" if info["healthy"] else "[red]down[/]", str(info["detail"]))
    console.print(table)
    if not all(info["healthy"] for info in components.values()):
        raise typer.Exit(1)


def down() -> None:
    """Stop everything `trainmaster up` started (job history stays in PostgreSQL)."""
    if not _server("api.stack.local").down(say=lambda msg: console.print(f"[dim]•[/] {msg}")):
        console.print("nothing was running")
        return
    console.print("[green]stopped[/]")


def ui(
    open_browser: Annotated[bool, typer.Option("--open/--no-open", help="open a browser or just print")] = True,
) -> None:
    """Open the dashboard: the local stack's (`trainmaster up`), else the API in TRAINMASTER_API_URL."""
    import webbrowser

    from trainmaster import config as client_config

    state = _server("api.stack.local").load_state()
    api_url = state.api_url if state else client_config.resolve().api_url
    if not _server("api.stack.local").api_ready(api_url):
        raise _fail(f"no API answers at {api_url}: start the local stack with `trainmaster up`")
    url = f"{api_url}/ui/"
    console.print(f"dashboard: {url}")
    console.print(f"sign in with the token in {client_config.config_path()} (or `trainmaster token create`)")
    if open_browser and not webbrowser.open(url):
        console.print("[yellow]no browser could be opened here; open the address above yourself[/]")
