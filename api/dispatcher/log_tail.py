"""Ray job logs read incrementally, so each reconcile round costs the new output, not the whole log.

One websocket per followed attempt (`/api/jobs/{id}/logs/tail`, Ray's own follower: the log from its
start, then each new chunk), all on one background event loop. A tail keeps only the text the
dispatcher has not stored yet: `since(id, offset)` drops everything before `offset` (what the
attempt's `log_offset` says is stored) and returns the rest.

Bounded whatever the job prints: the text passes through `LineCutter` as it arrives (offsets count
its output), a websocket message is at most `MESSAGE_MAX_BYTES` (a longer one ends the tail, and the
caller reads the log as a stream instead), and a tail holding `hold_max_chars` stops reading its
socket until `since` takes what it holds (Ray's side waits; nothing is lost).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from api.dispatcher.log_cut import LineCutter

MESSAGE_MAX_BYTES = 4 * 1024 * 1024  # aiohttp refuses a longer frame from its header, before reading it

log = logging.getLogger("trainmaster.dispatcher.logs")


@dataclass
class _Tail:
    cutter: LineCutter
    base: int = 0  # offset in the cut log of text[0] (past `received` when the store is ahead)
    received: int = 0  # characters of cut log the socket brought so far
    text: str = ""
    room: asyncio.Event | None = None  # set when `since` took what the tail held
    finished: bool = False  # the websocket closed: the job ended and everything arrived
    failed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    future: Future[None] | None = None
    read_at: float = field(default_factory=time.monotonic)  # when `since` last asked for it


class LogTails:
    """Bounded: a tail nobody read for `idle_s` (its attempt was lost, or another dispatcher took the
    job's lease) is closed, and at most `cap` are open (the least recently read goes first)."""

    idle_s = 300.0
    cap = 2000

    def __init__(
        self, address: str, headers: dict[str, str], *, line_max_bytes: int = 8192, hold_max_chars: int = 1 << 20
    ):
        self.line_max_bytes = line_max_bytes
        self.hold_max_chars = hold_max_chars
        self.url = address.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        self.headers = headers
        self.tails: dict[str, _Tail] = {}
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="trainmaster-log-tails", daemon=True).start()

    def since(self, submission_id: str, offset: int) -> str | None:
        """The log after `offset`, or None when no tail has it yet (start one; read the whole log now)."""
        tail = self.tails.get(submission_id)
        if tail is None or tail.failed:
            self.follow(submission_id)
            return None
        tail.read_at = time.monotonic()
        with tail.lock:
            if offset < tail.base:  # the store is behind what this tail kept (a rolled-back round): start over
                return None
            # Past what arrived (another dispatcher stored it): the socket's text up to `offset` is dropped.
            tail.base, tail.text = offset, tail.text[offset - tail.base :]
            text = tail.text
        if tail.room is not None:
            self.loop.call_soon_threadsafe(tail.room.set)
        return text

    def finished(self, submission_id: str) -> bool:
        tail = self.tails.get(submission_id)
        return tail is not None and tail.finished

    def follow(self, submission_id: str) -> None:
        self.forget(submission_id)
        self.prune()
        tail = _Tail(cutter=LineCutter(self.line_max_bytes))
        self.tails[submission_id] = tail
        tail.future = asyncio.run_coroutine_threadsafe(self._read(submission_id, tail), self.loop)

    def prune(self) -> None:
        """Close the tails nobody reads any more, then the least recently read ones past `cap`."""
        now = time.monotonic()
        for submission_id, tail in list(self.tails.items()):
            if now - tail.read_at > self.idle_s:
                self.forget(submission_id)
        while len(self.tails) >= self.cap:
            self.forget(min(self.tails, key=lambda key: self.tails[key].read_at))

    def close(self) -> None:
        """Cancel every tail and stop the background loop."""
        for submission_id in list(self.tails):
            self.forget(submission_id)
        self.loop.call_soon_threadsafe(self.loop.stop)

    def forget(self, submission_id: str) -> None:
        tail = self.tails.pop(submission_id, None)
        if tail is not None and tail.future is not None:
            tail.future.cancel()

    async def _read(self, submission_id: str, tail: _Tail) -> None:
        import aiohttp

        tail.room = asyncio.Event()
        url = f"{self.url}/api/jobs/{submission_id}/logs/tail"
        try:
            async with (
                aiohttp.ClientSession(headers=self.headers) as session,
                session.ws_connect(url, max_msg_size=MESSAGE_MAX_BYTES) as socket,
            ):
                async for message in socket:
                    if message.type is aiohttp.WSMsgType.TEXT:
                        self._add(tail, tail.cutter.feed(message.data))
                        while len(tail.text) >= self.hold_max_chars:  # read no more until `since` drains it
                            tail.room.clear()
                            await tail.room.wait()
                    elif message.type is aiohttp.WSMsgType.ERROR:
                        raise ConnectionError(str(socket.exception()))
            self._add(tail, tail.cutter.finish())
            tail.finished = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the head went away or refused: the caller reads whole logs
            log.warning("log_tail_ended", extra={"submission_id": submission_id, "error": str(exc)})
            tail.failed = True

    @staticmethod
    def _add(tail: _Tail, text: str) -> None:
        with tail.lock:
            start = tail.received
            tail.received += len(text)
            if tail.received > tail.base:
                tail.text += text[max(0, tail.base - start) :]
