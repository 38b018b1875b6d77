"""Ray job logs read incrementally, so each reconcile round costs the new output, not the whole log.

One websocket per followed attempt (`/api/jobs/{id}/logs/tail`, Ray's own follower: the log from its
start, then each new chunk), all on one background event loop. A tail keeps only the text the
dispatcher has not stored yet: `since(id, offset)` drops everything before `offset` (what the
attempt's `log_offset` says is stored) and returns the rest.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

log = logging.getLogger("trainmaster.dispatcher.logs")


@dataclass
class _Tail:
    base: int = 0  # absolute offset of text[0] in the Ray job's log
    text: str = ""
    finished: bool = False  # the websocket closed: the job ended and everything arrived
    failed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    future: Future[None] | None = None


class LogTails:
    def __init__(self, address: str, headers: dict[str, str]):
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
        with tail.lock:
            start = offset - tail.base
            if start < 0:  # the store is behind what this tail kept (a rolled-back round): start over
                return None
            if start > len(tail.text):  # still receiving what is already stored
                return ""
            tail.base, tail.text = offset, tail.text[start:]
            return tail.text

    def finished(self, submission_id: str) -> bool:
        tail = self.tails.get(submission_id)
        return tail is not None and tail.finished

    def follow(self, submission_id: str) -> None:
        self.forget(submission_id)
        tail = _Tail()
        self.tails[submission_id] = tail
        tail.future = asyncio.run_coroutine_threadsafe(self._read(submission_id, tail), self.loop)

    def forget(self, submission_id: str) -> None:
        tail = self.tails.pop(submission_id, None)
        if tail is not None and tail.future is not None:
            tail.future.cancel()

    async def _read(self, submission_id: str, tail: _Tail) -> None:
        import aiohttp

        try:
            async with (
                aiohttp.ClientSession(headers=self.headers) as session,
                session.ws_connect(f"{self.url}/api/jobs/{submission_id}/logs/tail") as socket,
            ):
                async for message in socket:
                    if message.type is aiohttp.WSMsgType.TEXT:
                        with tail.lock:
                            tail.text += message.data
                    elif message.type is aiohttp.WSMsgType.ERROR:
                        raise ConnectionError(str(socket.exception()))
            tail.finished = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the head went away or refused: the caller reads whole logs
            log.warning("log tail of %s ended: %s", submission_id, exc)
            tail.failed = True
