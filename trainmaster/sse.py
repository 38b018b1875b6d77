"""A small server-sent-events reader over httpx, resuming with Last-Event-ID after a drop."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from trainmaster.errors import ConnectionFailed, TrainmasterError, error_from_response
from trainmaster.retry import delay_before_retry, is_transient


@dataclass
class ServerEvent:
    event: str
    data: Any
    id: str | None = None


def parse(lines: Iterator[str]) -> Iterator[ServerEvent]:
    name, event_id = "message", None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield ServerEvent(name, json.loads("\n".join(data)), event_id)
            name, data, event_id = "message", [], None
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
            elif field == "id":
                event_id = value


def follow(
    http: httpx.Client,
    path: str,
    *,
    last_event_id: str | None = None,
    retry_for: float | None = None,
    read_timeout: float = 60.0,
) -> Iterator[ServerEvent]:
    """Events until the server sends `end`.

    A dropped or refused connection, a 503 or a 429 (`trainmaster.retry`) is retried, after the
    server's Retry-After or a growing backoff, with `Last-Event-ID` set to the id of the last whole
    event delivered: the server resumes after it, so no row comes twice and none is skipped (an event
    cut off in the middle was never delivered and comes again whole). `retry_for` bounds one outage in
    seconds (None: retry until the stream ends), after which its last error (ConnectionFailed,
    ServiceUnavailable, TooManyRequests) raises; other errors (401, 404, 422) raise at once."""
    failures = 0
    outage_began: float | None = None
    while True:
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        try:
            try:
                timeout = httpx.Timeout(10.0, read=read_timeout)
                with http.stream("GET", path, headers=headers, timeout=timeout) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise error_from_response(response)
                    for event in parse(response.iter_lines()):
                        failures, outage_began = 0, None
                        if event.id:
                            last_event_id = event.id
                        yield event
                        if event.event == "end":
                            return
                raise ConnectionFailed(f"the event stream {path} closed before its end event")
            except httpx.TransportError as exc:
                raise ConnectionFailed(f"the event stream {path} broke off ({exc.__class__.__name__}: {exc})") from exc
        except TrainmasterError as exc:
            if not is_transient(exc):
                raise
            failures += 1
            now = time.monotonic()
            outage_began = now if outage_began is None else outage_began
            if retry_for is not None and now - outage_began >= retry_for:
                raise
            time.sleep(delay_before_retry(exc, failures))
