"""`trainmaster sweep`: start a hyperparameter sweep, follow it, list, cancel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from trainmaster.cli.output import SHORT_ID, ApiUrl, Token, client_errors, console, fail
from trainmaster.client import Client
from trainmaster.models import Sweep, SweepSpec, SweepStatus

sweep_app = typer.Typer(help="Hyperparameter sweeps whose trials are jobs; losers stopped early.", no_args_is_help=True)

SweepId = Annotated[str, typer.Argument(help="a sweep id")]


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_param(item: str) -> tuple[str, dict[str, Any]]:
    """`lr=log_uniform:1e-4:0.1`, `dropout=uniform:0:0.5`, `hidden=32,64,128` (values)."""
    name, sep, rest = item.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"--param expects NAME=SPEC, got {item!r}")
    kind, _, bounds = rest.partition(":")
    if kind in ("uniform", "log_uniform"):
        low, _, high = bounds.partition(":")
        return name, {kind: [float(low), float(high)]}
    return name, {"values": [_scalar(v) for v in rest.split(",")]}


@sweep_app.command("start")
@client_errors
def start(
    entrypoint: Annotated[str | None, typer.Argument(help="pkg.module:fn, script:train.py or builtin:NAME")] = None,
    param: Annotated[
        list[str], typer.Option("--param", "-p", help="lr=log_uniform:1e-4:0.1 · x=uniform:0:1 · h=32,64")
    ] = [],  # noqa: B006
    metric: Annotated[str | None, typer.Option(help="the logged metric to rank and stop trials by")] = None,
    mode: Annotated[str, typer.Option(help="min or max")] = "min",
    name: Annotated[str | None, typer.Option(help="sweep name (default: the entrypoint)")] = None,
    spec_file: Annotated[Path | None, typer.Option("--file", "-f", help="a whole sweep (SweepSpec) as JSON")] = None,
    config: Annotated[str | None, typer.Option(help="JSON object: the trials' config before their parameters")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-n", help="gang size of each trial")] = None,
    max_trials: Annotated[int | None, typer.Option(help="trials in all (a grid: all its points)")] = None,
    max_concurrent: Annotated[int | None, typer.Option(help="trials running or queued at once")] = None,
    early_stopping: Annotated[str | None, typer.Option(help="asha, median or none")] = None,
    grace_steps: Annotated[int | None, typer.Option(help="first step a trial can be stopped at")] = None,
    reduction_factor: Annotated[int | None, typer.Option(help="ASHA keeps the best 1/N at each rung")] = None,
    seed: Annotated[int | None, typer.Option(help="sampling seed (the same seed, the same trials)")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="show the ranking until the sweep ends")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Start a sweep: trials are jobs with `config` updated by their parameters."""
    body: dict[str, Any] = json.loads(spec_file.read_text()) if spec_file else {}
    spec = body.setdefault("spec", {})
    if entrypoint:
        spec["entrypoint"] = entrypoint
    if "entrypoint" not in spec:
        fail("give an ENTRYPOINT or --file sweep.json")
    spec.setdefault("name", spec["entrypoint"].split(":")[-1][:128])
    body.setdefault("name", name or spec["name"])
    if name:
        body["name"] = name
    if config:
        spec["config"] = {**spec.get("config", {}), **json.loads(config)}
    if workers is not None:
        spec.setdefault("scaling", {})["num_workers"] = workers
    try:
        body["parameters"] = {**body.get("parameters", {}), **dict(parse_param(p) for p in param)}
    except ValueError as exc:
        fail(str(exc))
    stopping = body.setdefault("early_stopping", {})
    for key, value in (
        ("policy", early_stopping),
        ("grace_steps", grace_steps),
        ("reduction_factor", reduction_factor),
    ):
        if value is not None:
            stopping[key] = value
    for key, value in (
        ("metric", metric),
        ("max_trials", max_trials),
        ("max_concurrent", max_concurrent),
        ("seed", seed),
    ):
        if value is not None:
            body[key] = value
    body.setdefault("mode", mode)
    try:
        request = SweepSpec.model_validate(body)
    except ValidationError as exc:
        fail("invalid sweep: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    with Client(api_url, token) as client:
        sweep = client.sweep(
            request.spec,
            name=request.name,
            parameters={k: v.model_dump(exclude_none=True) for k, v in request.parameters.items()},
            metric=request.metric,
            mode=request.mode,
            max_trials=request.max_trials,
            max_concurrent=request.max_concurrent,
            early_stopping=request.early_stopping.model_dump(),
            seed=request.seed,
        )
        console.print(f"sweep [bold]{sweep.id}[/] ({escape(sweep.info.name)}): {sweep.info.max_trials} trials")
        if wait:
            with console.status(f"waiting for sweep {sweep.id[:SHORT_ID]} to end…"):
                sweep.wait()
            console.print(sweep_table(sweep.info))


@sweep_app.command("get")
@client_errors
def get(
    sweep_id: SweepId,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """Show a sweep: its trials ranked by the metric, best first, and why any were stopped."""
    with Client(api_url, token) as client:
        sweep = client.get_sweep(sweep_id).info
    if output_json:
        print(sweep.model_dump_json(indent=2))
        return
    console.print(sweep_table(sweep))
    for trial in sweep.trials:
        if trial.stopped_reason:
            console.print(f"trial {trial.n}: {trial.stopped_reason}", markup=False, highlight=False)


@sweep_app.command("ls")
@client_errors
def list_sweeps(
    status: Annotated[SweepStatus | None, typer.Option(help="only sweeps with this status")] = None,
    limit: Annotated[int, typer.Option(help="how many sweeps")] = 20,
    output_json: Annotated[bool, typer.Option("--json")] = False,
    api_url: ApiUrl = None,
    token: Token = None,
) -> None:
    """List sweeps, newest first, with trial counts and the best metric."""
    with Client(api_url, token) as client:
        sweeps = client.sweeps(status=status, limit=limit)
    if output_json:
        print(json.dumps([s.model_dump(mode="json") for s in sweeps], indent=2))
        return
    table = Table(box=None, pad_edge=False)
    for column in ("id", "name", "status", "trials", "best"):
        table.add_column(column, overflow="ellipsis", no_wrap=True, max_width=24 if column == "name" else None)
    for sweep in sweeps:
        counts = " ".join(f"{n} {status}" for status, n in sorted(sweep.trial_counts.items()))
        best = f"{sweep.metric} {sweep.best.metric:.4g}" if sweep.best and sweep.best.metric is not None else "-"
        table.add_row(sweep.id[:SHORT_ID], escape(sweep.name), sweep.status.value, counts, escape(best))
    console.print(table if sweeps else "no sweeps yet: start one with `trainmaster sweep start`")


@sweep_app.command("cancel")
@client_errors
def cancel(sweep_id: SweepId, api_url: ApiUrl = None, token: Token = None) -> None:
    """Cancel a sweep and every trial that has not ended."""
    with Client(api_url, token) as client:
        sweep = client.cancel_sweep(sweep_id)
    console.print(f"sweep {sweep.id}: {sweep.status.value}")


def sweep_table(sweep: Sweep) -> Table:
    """Trials ranked best first, within 80 columns."""
    title = escape(f"{sweep.name} · {sweep.status.value} · {sweep.mode} {sweep.metric}")
    table = Table(title=title, box=None, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("job")
    table.add_column("status", no_wrap=True)
    table.add_column(escape(sweep.metric), justify="right", max_width=12, overflow="ellipsis", no_wrap=True)
    table.add_column("step", justify="right")
    table.add_column("params", overflow="ellipsis", no_wrap=True, max_width=36)
    for trial in sweep.trials:
        params = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
        metric = "-" if trial.metric is None else f"{trial.metric:.4g}"
        step = "-" if trial.step is None else str(trial.step)
        table.add_row(str(trial.n), trial.job_id[:SHORT_ID], trial.status, metric, step, escape(params))
    return table
