"""`trainmaster cluster add|ls`, `trainmaster project create|ls|set`, `trainmaster token ls|revoke`,
`trainmaster storage`: over
the REST API with an admin token (a project token reads its own project and tokens)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from trainmaster.admin import UNSET, Admin, Unset, parse_resources
from trainmaster.cli.bench import parse_size
from trainmaster.cli.output import ApiUrl, Token, amounts, client_errors, console, fail
from trainmaster.errors import TrainmasterError
from trainmaster.packing import human_bytes

SHORT_ID = 8
cluster_app = typer.Typer(help="Ray clusters (trust domains) the platform dispatches to; admin.", no_args_is_help=True)
project_app = typer.Typer(
    help="Projects: each bound to one cluster, with a max priority, a quota and a cohort.", no_args_is_help=True
)


def _table(*columns: str) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment else "-"


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--label takes KEY=VALUE, not {pair!r}")
        labels[key] = value
    return labels


@cluster_app.command("add")
@client_errors
def cluster_add(
    name: Annotated[str, typer.Argument(help="the cluster's name")],
    address: Annotated[str, typer.Option(help="the Ray dashboard address (Jobs API), e.g. http://ray-a:8265")],
    token_file: Annotated[
        str | None, typer.Option(help="its Ray token's file, in the API's and dispatcher's TRAINMASTER_SECRETS_PATH")
    ] = None,
    token_env: Annotated[
        str | None, typer.Option(help="their environment variable holding it, named TRAINMASTER_CLUSTER_TOKEN_*")
    ] = None,
    label: Annotated[list[str], typer.Option(help="KEY=VALUE, repeatable")] = [],  # noqa: B006
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Register a Ray cluster (the token itself is never stored: only where it is read from)."""
    with Admin(api_url, token) as admin:
        cluster = admin.add_cluster(name, address, token_file=token_file, token_env=token_env, labels=_labels(label))
    console.print(f"cluster [bold]{escape(cluster.name)}[/] added: {escape(cluster.address)}", highlight=False)


@cluster_app.command("ls")
@client_errors
def cluster_ls(
    output_json: Annotated[bool, typer.Option("--json")] = False, api_url: ApiUrl = None, token: Token = None
) -> None:
    """List the clusters."""
    with Admin(api_url, token) as admin:
        clusters = admin.clusters()
    if output_json:
        print(json.dumps([cluster.model_dump(mode="json") for cluster in clusters], indent=2))
        return
    table = _table("NAME", "ADDRESS", "RAY TOKEN FROM", "LABELS")
    for cluster in clusters:
        source = cluster.token_file or (f"${cluster.token_env}" if cluster.token_env else "-")
        labels = ",".join(f"{k}={v}" for k, v in cluster.labels.items()) or "-"
        table.add_row(*map(escape, (cluster.name, cluster.address, source, labels)))
    console.print(table)


QuotaOption = Annotated[str | None, typer.Option(help="RESOURCE=AMOUNT[,...] for CPU and GPU, e.g. GPU=8,CPU=64")]
CohortOption = Annotated[str | None, typer.Option(help="a cohort: its projects lend each other unused quota")]
BorrowOption = Annotated[str | None, typer.Option(help="most it borrows beyond its quota, e.g. GPU=4")]
LendOption = Annotated[str | None, typer.Option(help="most of its unused quota it lends, e.g. GPU=2")]


def _resources(text: str | None, option: str) -> dict[str, float] | None:
    if text is None:
        return None
    try:
        return parse_resources(text, option)
    except TrainmasterError as exc:
        fail(str(exc))


T = TypeVar("T")


def _clearable(text: str | None, option: str, parse: Callable[[str], T], expects: str) -> T | Unset | None:
    """An option that may clear a setting: left out, unchanged; 'none', cleared; else `parse`d."""
    if text is None:
        return UNSET
    if text.lower() == "none":
        return None
    try:
        return parse(text)
    except ValueError:
        fail(f"{option} takes {expects} or 'none', not {text!r}")


def _days(text: str | None, option: str) -> float | Unset | None:
    return _clearable(text, option, float, "a number of days")


def _bytes(text: str | None, option: str) -> int | Unset | None:
    """500G, 2T, 1024 (K, M, G, T are powers of 1024)."""
    return _clearable(text, option, parse_size, "a size")


@project_app.command("create")
@client_errors
def project_create(
    name: Annotated[str, typer.Argument(help="the project's name")],
    cluster: Annotated[str, typer.Option(help="the cluster its jobs run on")] = "default",
    max_priority: Annotated[int, typer.Option(help="highest priority its jobs may ask for, -100..100")] = 100,
    quota: QuotaOption = None,
    cohort: CohortOption = None,
    borrowing_limit: BorrowOption = None,
    lending_limit: LendOption = None,
    storage_quota: Annotated[
        str | None, typer.Option(help="bytes of checkpoints and code it may store, e.g. 500G (default: unlimited)")
    ] = None,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Create a project on a cluster, with a quota, a cohort and a storage quota when given."""
    storage_quota_bytes = _bytes(storage_quota, "--storage-quota")
    with Admin(api_url, token) as admin:
        project = admin.create_project(
            name,
            cluster=cluster,
            max_priority=max_priority,
            quota=_resources(quota, "--quota"),
            cohort=cohort,
            borrowing_limit=_resources(borrowing_limit, "--borrowing-limit"),
            lending_limit=_resources(lending_limit, "--lending-limit"),
            storage_quota_bytes=None if isinstance(storage_quota_bytes, Unset) else storage_quota_bytes,
        )
    console.print(f"project [bold]{project.name}[/] on cluster {project.cluster}", highlight=False)


@project_app.command("ls")
@client_errors
def project_ls(
    output_json: Annotated[bool, typer.Option("--json")] = False, api_url: ApiUrl = None, token: Token = None
) -> None:
    """List projects (a project token sees its own): quota, what its jobs hold now, cohort."""
    with Admin(api_url, token) as admin:
        projects = admin.projects()
    if output_json:
        print(json.dumps([project.model_dump(mode="json") for project in projects], indent=2))
        return
    table = _table("NAME", "CLUSTER", "MAX PRIO", "QUOTA", "HOLDS", "COHORT")
    for project in projects:
        holds = {name: amount for name, amount in project.usage.items() if amount}
        table.add_row(
            *map(
                escape,
                (
                    project.name,
                    project.cluster,
                    str(project.max_priority),
                    amounts(project.quota),
                    amounts(holds),
                    project.cohort or "-",
                ),
            )
        )
    console.print(table)


@project_app.command("set")
@client_errors
def project_set(
    name: Annotated[str, typer.Argument(help="the project's name")],
    cluster: Annotated[str | None, typer.Option(help="move it to this cluster")] = None,
    max_priority: Annotated[int | None, typer.Option(help="highest priority its jobs may ask for")] = None,
    quota: Annotated[
        str | None, typer.Option(help="RESOURCE=AMOUNT[,...] (CPU, GPU) replacing its quota; 'none' lifts it")
    ] = None,
    cohort: Annotated[str | None, typer.Option(help="its cohort; 'none' leaves it")] = None,
    borrowing_limit: Annotated[str | None, typer.Option(help="e.g. GPU=4; 'none': no limit")] = None,
    lending_limit: Annotated[str | None, typer.Option(help="e.g. GPU=2; 'none': no limit")] = None,
    checkpoint_retention_days: Annotated[
        str | None,
        typer.Option(help="days after a job finished that its unpinned checkpoints are deleted; 'none': kept"),
    ] = None,
    storage_quota: Annotated[
        str | None, typer.Option(help="bytes of checkpoints and code it may store, e.g. 500G; 'none': unlimited")
    ] = None,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Change a project's cluster, max priority, quota, cohort, limits, checkpoint retention or storage quota."""
    given = (
        cluster,
        max_priority,
        quota,
        cohort,
        borrowing_limit,
        lending_limit,
        checkpoint_retention_days,
        storage_quota,
    )
    if all(value is None for value in given):
        fail(
            "give --cluster, --max-priority, --quota, --cohort, --borrowing-limit, --lending-limit,"
            " --checkpoint-retention-days or --storage-quota"
        )

    def cleared(text: str | None, option: str) -> dict[str, float] | Unset | None:
        if text is None:
            return UNSET
        return _resources(text, option) or None  # 'none': no limit

    with Admin(api_url, token) as admin:
        project = admin.set_project(
            name,
            cluster=cluster,
            max_priority=max_priority,
            quota=_resources(quota, "--quota"),
            cohort=UNSET if cohort is None else (None if cohort.lower() == "none" else cohort),
            borrowing_limit=cleared(borrowing_limit, "--borrowing-limit"),
            lending_limit=cleared(lending_limit, "--lending-limit"),
            checkpoint_retention_days=_days(checkpoint_retention_days, "--checkpoint-retention-days"),
            storage_quota_bytes=_bytes(storage_quota, "--storage-quota"),
        )
    kept = "forever" if project.checkpoint_retention_days is None else f"{project.checkpoint_retention_days:g} days"
    console.print(
        f"project [bold]{escape(project.name)}[/]: cluster {escape(project.cluster)}, max priority "
        f"{project.max_priority}, quota {amounts(project.quota)}, cohort {escape(project.cohort or '-')}, "
        f"checkpoints of finished jobs kept {kept}, storage quota {_quota_bytes(project.storage_quota_bytes)}",
        highlight=False,
    )


def _quota_bytes(quota: int | None) -> str:
    return "unlimited" if quota is None else human_bytes(quota)


@client_errors
def storage(
    output_json: Annotated[bool, typer.Option("--json")] = False, api_url: ApiUrl = None, token: Token = None
) -> None:
    """What each project stores: live checkpoints and code packages, against its storage quota."""
    with Admin(api_url, token) as admin:
        rows = admin.storage()
    if output_json:
        print(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
        return
    table = _table("PROJECT", "USED", "QUOTA", "USE", "CHECKPOINTS", "CHECKPOINT BYTES", "CODE BYTES")
    for row in rows:
        share = "-" if not row.quota_bytes else f"{row.used_bytes / row.quota_bytes:.0%}"
        table.add_row(
            escape(row.project),
            human_bytes(row.used_bytes),
            _quota_bytes(row.quota_bytes),
            share,
            str(row.checkpoints),
            human_bytes(row.checkpoint_bytes),
            human_bytes(row.code_bytes),
        )
    console.print(table)


@client_errors
def token_ls(
    output_json: Annotated[bool, typer.Option("--json")] = False, api_url: ApiUrl = None, token: Token = None
) -> None:
    """List tokens not revoked (an admin sees all; a project token its project's)."""
    with Admin(api_url, token) as admin:
        tokens = admin.tokens()
    if output_json:
        print(json.dumps([item.model_dump(mode="json") for item in tokens], indent=2))
        return
    table = _table("ID", "PROJECT", "SCOPE", "USER", "EXPIRES", "LAST USED")
    for item in tokens:
        table.add_row(
            item.id[:SHORT_ID],
            item.project,
            item.scope,
            escape(item.user or item.description or "-"),
            _when(item.expires_at) if item.expires_at else "never",
            _when(item.last_used_at),
        )
    console.print(table)


@client_errors
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="a token id, or an unambiguous prefix (ls shows 8 characters)")],
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Revoke a token: refused at once by every API process; its open streams end within seconds."""
    with Admin(api_url, token) as admin:
        admin.revoke_token(token_id)
    console.print(f"token {token_id} revoked")


def register(app: typer.Typer, token_app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")
    app.add_typer(project_app, name="project")
    app.command("storage")(storage)
    token_app.command("ls")(token_ls)
    token_app.command("revoke")(token_revoke)
