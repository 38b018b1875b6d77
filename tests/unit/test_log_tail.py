"""LogTails against a real websocket server that speaks like Ray's `/api/jobs/{id}/logs/tail`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from api.dispatcher.log_tail import LogTails
from tests.factories.waiting import wait_until


class FakeRayLogs:
    """Sends each job's chunks as they are added; closes the socket when the job is marked ended."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[str]] = {}
        self.ended: set[str] = set()
        self.tokens: list[str | None] = []

    async def tail(self, request: web.Request) -> web.WebSocketResponse:
        self.tokens.append(request.headers.get("Authorization"))
        socket = web.WebSocketResponse(timeout=1.0)  # a client that was cancelled never answers the close
        await socket.prepare(request)
        job, sent = request.match_info["job"], 0
        while True:
            chunks = self.chunks.get(job, [])
            for chunk in chunks[sent:]:
                await socket.send_str(chunk)
            sent = len(chunks)
            if job in self.ended:
                await socket.close()
                return socket
            await asyncio.sleep(0.01)


@pytest.fixture
def ray_logs() -> Iterator[tuple[FakeRayLogs, str]]:
    fake = FakeRayLogs()
    app = web.Application()
    app.router.add_get("/api/jobs/{job}/logs/tail", fake.tail)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=5.0)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())  # the kernel's free port: no race
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{port}"
    fake.ended |= set(fake.chunks)  # let open sockets close
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)  # a loaded machine is slow to close
    loop.call_soon_threadsafe(loop.stop)


def test_since_returns_only_what_is_not_stored_yet(ray_logs: tuple[FakeRayLogs, str]) -> None:
    fake, address = ray_logs
    tails = LogTails(address, {"Authorization": "Bearer ray-token"})
    fake.chunks["tm-1"] = ["a\nb\n"]
    assert tails.since("tm-1", 0) is None  # no tail yet: the caller reads the whole log this once
    wait_until(lambda: tails.since("tm-1", 0) == "a\nb\n", 5, interval=0.02, what="the tail to hold the log")
    fake.chunks["tm-1"].append("c\n")
    # 4 characters are stored: only the new line
    wait_until(lambda: tails.since("tm-1", 4) == "c\n", 5, interval=0.02, what="the tail to hold the new line")
    assert tails.tails["tm-1"].text == "c\n"  # what is stored is no longer kept
    assert tails.since("tm-1", 6) == ""
    fake.ended.add("tm-1")
    wait_until(lambda: tails.finished("tm-1"), 5, interval=0.02, what="the tail to see the log's end")
    assert fake.tokens == ["Bearer ray-token"]


def test_a_store_ahead_of_the_tail_gets_nothing_twice(ray_logs: tuple[FakeRayLogs, str]) -> None:
    fake, address = ray_logs
    tails = LogTails(address, {})
    fake.chunks["tm-2"] = ["0123456789\n"]
    tails.follow("tm-2")  # a dispatcher that took over: 8 characters were stored by the one before
    wait_until(lambda: tails.since("tm-2", 8) == "89\n", 5, interval=0.02, what="the part not stored yet")
    assert tails.since("tm-2", 2) is None  # behind what the tail dropped: read the whole log instead


def test_tails_nobody_reads_are_closed_and_their_number_is_capped(ray_logs: tuple[FakeRayLogs, str]) -> None:
    fake, address = ray_logs
    tails = LogTails(address, {})
    tails.cap = 3
    for n in range(5):  # attempts this dispatcher follows, then loses (lost, or their lease moved)
        fake.chunks[f"tm-{n}"] = ["x\n"]
        fake.ended.add(f"tm-{n}")  # each socket closes once sent: nothing is left open at teardown
        tails.follow(f"tm-{n}")
    assert sorted(tails.tails) == ["tm-2", "tm-3", "tm-4"]  # the least recently read went first
    tails.tails["tm-3"].read_at -= 2 * tails.idle_s  # nobody asked for it since
    fake.chunks["tm-5"] = ["x\n"]
    fake.ended.add("tm-5")
    tails.follow("tm-5")
    assert sorted(tails.tails) == ["tm-2", "tm-4", "tm-5"]


def test_close_ends_every_tail_and_the_loop(ray_logs: tuple[FakeRayLogs, str]) -> None:
    fake, address = ray_logs
    tails = LogTails(address, {})
    fake.chunks["tm-9"] = ["x\n"]
    fake.ended.add("tm-9")
    tails.follow("tm-9")
    tails.close()
    assert tails.tails == {}
    wait_until(lambda: not tails.loop.is_running(), 5, interval=0.02, what="the tails' loop to stop")
