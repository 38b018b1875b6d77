"""A small server-sent-events reader over httpx, resuming with Last-Event-ID after a drop: `follow` for
`httpx.Client`, `follow_async` for `httpx.AsyncClient`. Parsing and the resume and retry rules
(`Resume`) are shared; each reader only connects, reads lines and sleeps its own way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from trainmaster.errors import ConnectionFailed, TrainmasterError, error_from_response
from trainmaster.retry import Retries


@dataclass
class ServerEvent:
    event: str
    data: Any
    id: str | None = None


@dataclass
class EventParser:
    """Turns lines into events, one line at a time (`feed` answers the event a blank line ends)."""

    name: str = "message"
    event_id: str | None = None
    data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> ServerEvent | None:
        if not line:
            event = ServerEvent(self.name, json.loads("\n".join(self.data)), self.event_id) if self.data else None
            self.name, self.data, self.event_id = "message", [], None
            return event
        if not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                self.name = value
            elif name == "data":
                self.data.append(value)
            elif name == "id":
                self.event_id = value
        return None


def parse(lines: Iterable[str]) -> Iterator[ServerEvent]:
    parser = EventParser()
    for line in lines:
        if (event := parser.feed(line)) is not None:
            yield event


class Resume:
    """What one followed stream remembers across connections: the id of the last whole event delivered
    (sent back as `Last-Event-ID`, so the server resumes after it) and its run of passing failures."""

    def __init__(self, path: str, *, last_event_id: str | None, retry_for: float | None, read_timeout: float):
        self.path = path
        self.last_event_id = last_event_id
        self.retries = Retries(give_up_after=retry_for)
        self.timeout = httpx.Timeout(10.0, read=read_timeout)

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id:
            headers["Last-Event-ID"] = self.last_event_id
        return headers

    def delivered(self, event: ServerEvent) -> None:
        self.retries.recovered()
        if event.id:
            self.last_event_id = event.id

    def closed_early(self) -> ConnectionFailed:
        return ConnectionFailed(f"the event stream {self.path} closed before its end event")

    @contextlib.contextmanager
    def connection(self) -> Iterator[None]:
        """Names a broken connection as ConnectionFailed (which `trainmaster.retry` calls passing)."""
        try:
            yield
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"the event stream {self.path} broke off ({exc.__class__.__name__}: {exc})") from exc


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
    resume = Resume(path, last_event_id=last_event_id, retry_for=retry_for, read_timeout=read_timeout)
    while True:
        try:
            with resume.connection(), http.stream("GET", path, headers=resume.headers(), timeout=resume.timeout) as got:
                if got.status_code >= 400:
                    got.read()
                    raise error_from_response(got)
                for event in parse(got.iter_lines()):
                    resume.delivered(event)
                    yield event
                    if event.event == "end":
                        return
            raise resume.closed_early()
        except TrainmasterError as exc:
            if (delay := resume.retries.delay(exc)) is None:
                raise
            time.sleep(delay)


async def follow_async(
    http: httpx.AsyncClient,
    path: str,
    *,
    last_event_id: str | None = None,
    retry_for: float | None = None,
    read_timeout: float = 60.0,
) -> AsyncIterator[ServerEvent]:
    """`follow` on an `httpx.AsyncClient`: the same events, resumes and retries; sleeps with asyncio."""
    resume = Resume(path, last_event_id=last_event_id, retry_for=retry_for, read_timeout=read_timeout)
    while True:
        try:
            with resume.connection():
                async with http.stream("GET", path, headers=resume.headers(), timeout=resume.timeout) as got:
                    if got.status_code >= 400:
                        await got.aread()
                        raise error_from_response(got)
                    parser = EventParser()
                    async for line in got.aiter_lines():
                        if (event := parser.feed(line)) is None:
                            continue
                        resume.delivered(event)
                        yield event
                        if event.event == "end":
                            return
            raise resume.closed_early()
        except TrainmasterError as exc:
            if (delay := resume.retries.delay(exc)) is None:
                raise
            await asyncio.sleep(delay)
