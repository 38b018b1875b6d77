"""A small server-sent-events reader over httpx, resuming with Last-Event-ID after a drop."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from trainmaster.errors import error_from_response


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
    max_retries: int = 30,
    read_timeout: float = 60.0,
) -> Iterator[ServerEvent]:
    """Events until the server sends `end`; reconnects (with Last-Event-ID) on a dropped connection."""
    failures = 0
    while True:
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        try:
            timeout = httpx.Timeout(10.0, read=read_timeout)
            with http.stream("GET", path, headers=headers, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    raise error_from_response(response)
                failures = 0
                for event in parse(response.iter_lines()):
                    if event.id:
                        last_event_id = event.id
                    yield event
                    if event.event == "end":
                        return
        except httpx.TransportError:
            failures += 1
            if failures > max_retries:
                raise
            time.sleep(min(0.2 * 2**failures, 5.0))
