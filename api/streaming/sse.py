"""Server-sent events with a per-message send timeout, so a reader that stops reading is dropped."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


def event(name: str, data: Any, event_id: int | None = None) -> bytes:
    lines = [f"event: {name}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, separators=(",", ":"), default=str))
    return ("\n".join(lines) + "\n\n").encode()


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


class EventStream(Response):
    """An ASGI response streaming `messages`; gives up on a client that does not take them in time."""

    media_type = "text/event-stream"

    def __init__(self, messages: AsyncIterator[bytes], *, send_timeout_s: float, on_close: Any = None):
        super().__init__(status_code=200, media_type=self.media_type)
        self.messages = messages
        self.send_timeout_s = send_timeout_s
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = asyncio.Event()

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.create_task(watch_disconnect())
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no"),
                    ],
                }
            )
            gone = asyncio.create_task(disconnected.wait())
            while True:
                # Wait for the next message or the client leaving, whichever is first, so a closed
                # stream frees its slot at once rather than at the next heartbeat.
                upcoming = asyncio.ensure_future(anext(self.messages))
                await asyncio.wait({upcoming, gone}, return_when=asyncio.FIRST_COMPLETED)
                if disconnected.is_set():
                    upcoming.cancel()
                    break
                try:
                    message = upcoming.result()
                except StopAsyncIteration:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    break
                try:
                    await asyncio.wait_for(
                        send({"type": "http.response.body", "body": message, "more_body": True}), self.send_timeout_s
                    )
                except (asyncio.TimeoutError, OSError):
                    break  # a reader that stopped reading: drop it
            gone.cancel()
        finally:
            watcher.cancel()
            with contextlib.suppress(RuntimeError):  # a generator cancelled mid-step may refuse aclose
                await self.messages.aclose()  # type: ignore[attr-defined]
            if self.on_close is not None:
                self.on_close()
