"""Live views for the CLI: metrics with a progress bar or table, and logs as they come."""

from __future__ import annotations

from collections import deque

from rich.live import Live
from rich.markup import escape
from rich.table import Table

from trainmaster.cli.output import console
from trainmaster.client import Client
from trainmaster.models import MetricValue

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: deque[float]) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(SPARK[int((v - low) / span * (len(SPARK) - 1))] for v in values)


def metrics_table(latest: dict[str, MetricValue], history: dict[str, deque[float]]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for column in ("METRIC", "STEP", "VALUE", "TREND"):
        table.add_column(column)
    for name in sorted(latest):
        point = latest[name]
        value = "nan" if point.value is None else f"{point.value:.5g}"
        table.add_row(escape(name), str(point.step if point.step is not None else "-"), value, sparkline(history[name]))
    return table


def follow_metrics(client: Client, job_id: str) -> None:
    """A live table of the latest value and trend of each metric (rank 0), until the job ends."""
    latest: dict[str, MetricValue] = {}
    history: dict[str, deque[float]] = {}
    with Live(Table.grid(), console=console, refresh_per_second=4) as live:
        for point in client.stream_metrics(job_id):
            if point.rank != 0:
                continue
            latest[point.name] = point
            trend = history.setdefault(point.name, deque(maxlen=40))
            if point.value is not None:
                trend.append(point.value)
            live.update(metrics_table(latest, history))


def follow_logs(client: Client, job_id: str) -> None:
    for line in client.logs(job_id, follow=True):
        console.print(line.line, markup=False, highlight=False, soft_wrap=True)
