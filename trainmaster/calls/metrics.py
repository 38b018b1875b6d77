"""Calls that read what a job reported: metric points and log lines, a page (after the last `seq`) at
a time or as an event stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainmaster.calls.base import (
    LOGS_PAGE,
    METRICS_PAGE,
    Call,
    Page,
    S,
    Stream,
)
from trainmaster.models import (
    LogLine,
    LogList,
    MetricList,
    MetricValue,
)

# -- metrics and logs -----------------------------------------------------------------------------


def metric_list(
    job_id: str, *, names: list[str] | None = None, since_step: int | None = None, max_points: int | None = None
) -> Call[Page[MetricValue]]:
    """Stored points, oldest first, all in one list (or about `max_points` per metric, downsampled).
    A long job's points can be millions: `iter_metrics` reads them a page at a time instead."""
    if max_points is None:
        return metric_pages(job_id, names=names, since_step=since_step)
    params = _metric_params(names, since_step, max_points=max_points)
    return Call("GET", f"/v1/jobs/{job_id}/metrics", lambda data: Page(_metric_items(data), None), params=params)


def metric_pages(
    job_id: str, *, names: list[str] | None = None, since_step: int | None = None, page_size: int | None = None
) -> Call[Page[MetricValue]]:
    """Every stored point, oldest first, read `page_size` (default 10,000, at most 100,000) at a
    time as the iteration reaches them: memory holds one page, whatever the job logged."""
    size = page_size or METRICS_PAGE
    return _seq_pages(f"/v1/jobs/{job_id}/metrics", _metric_params(names, since_step, limit=size), size, _metric_items)


def _metric_params(names: list[str] | None, since_step: int | None, **more: int) -> dict[str, Any]:
    params: dict[str, Any] = {"name": names or [], **more}
    if since_step is not None:
        params["since_step"] = since_step
    return params


def _metric_items(data: Any) -> list[MetricValue]:
    return MetricList.model_validate(data).items


def _seq_pages(path: str, params: dict[str, Any], size: int, items: Callable[[Any], list[S]]) -> Call[Page[S]]:
    """Pages of rows in `seq` order: the next page starts after the last row's seq; a short page is the last."""

    def page(data: Any) -> Page[S]:
        rows = items(data)
        if len(rows) < size:
            return Page(rows, None)
        return Page(rows, _seq_pages(path, {**params, "after_seq": rows[-1].seq}, size, items))

    return Call("GET", path, page, params=params)


def metric_stream(job_id: str, *, after_seq: int | None = None, retry_for: float | None = None) -> Stream[MetricValue]:
    """Every metric value as it arrives; ends when the job ends. Reconnects by itself through dropped
    connections, 503 and 429 (after Retry-After), resuming after the last value delivered, so none
    comes twice or goes missing; `retry_for` s of outage (default: no limit) raise the last error."""
    resume = str(after_seq) if after_seq else None
    return Stream(f"/v1/jobs/{job_id}/metrics/stream", "metrics", MetricValue.model_validate, resume, retry_for)


def log_reading(
    job_id: str, *, follow: bool = False, page_size: int = LOGS_PAGE, retry_for: float | None = None
) -> Call[Page[LogLine]] | Stream[LogLine]:
    """Every stored log line, oldest first, read `page_size` (at most 100,000) at a time as the
    iteration reaches them. With follow=True the lines come from the job's stream instead: stored
    ones, then new ones as they are written until the job ends, reconnecting like `stream_metrics`."""
    if follow:
        return Stream(f"/v1/jobs/{job_id}/logs/stream", "logs", LogLine.model_validate, None, retry_for)
    return _log_pages(job_id, 0, page_size)


def _log_pages(job_id: str, after_seq: int, size: int) -> Call[Page[LogLine]]:
    """Pages of stored lines: the API ends a page at `size` lines or at the bytes a page may hold, and
    says where the next starts (`next_after_seq`); none said, this page is the last."""

    def page(data: Any) -> Page[LogLine]:
        listed = LogList.model_validate(data)
        following = listed.next_after_seq
        return Page(listed.items, None if following is None else _log_pages(job_id, following, size))

    return Call("GET", f"/v1/jobs/{job_id}/logs", page, params={"after_seq": after_seq, "limit": size})
