"""What one tenant prints cannot grow the shared dispatcher: a job that writes 1 GiB without a newline
is read by the real log tail (websocket) and the real final read (a streamed HTTP answer) in a process
of their own, whose resident memory is measured from /proc before and after."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
# TRAINMASTER_TEST_FLOOD_BYTES makes the flood smaller or larger; the bound asserted stays the same.
FLOOD_BYTES = int(os.environ.get("TRAINMASTER_TEST_FLOOD_BYTES", str(1 << 30)))
GROWTH_MAX_BYTES = 64 << 20
LINE_MAX = 8192
BLOCK = b"x" * (1 << 20)
FIRST, LAST = "first line\n", "\nlast line\n"


class FakeRay:
    """Ray's two log routes, both giving FIRST, FLOOD_BYTES of `x` without a newline, then LAST: the
    websocket tail in 1 MiB messages, the state API's file stream in 1 MiB writes."""

    async def tail(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        await socket.send_str(FIRST)
        text, left = BLOCK.decode(), FLOOD_BYTES
        while left > 0:
            await socket.send_str(text[: min(left, len(text))])
            left -= len(text)
        await socket.send_str(LAST)
        await socket.close()
        return socket

    async def job(self, request: web.Request) -> web.Response:
        return web.json_response({"submission_id": request.match_info["job"], "driver_node_id": "node-1"})

    async def file(self, request: web.Request) -> web.StreamResponse:
        assert request.query["submission_id"] == "tm-flood" and request.query["lines"] == "-1"
        if request.query.get("node_id") != "node-1":  # as Ray's state API: no node, no log file
            raise web.HTTPInternalServerError(text="node_id or node_ip must be provided")
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        await response.write(FIRST.encode())
        left = FLOOD_BYTES
        while left > 0:
            await response.write(BLOCK[: min(left, len(BLOCK))])
            left -= len(BLOCK)
        await response.write(LAST.encode())
        await response.write_eof()
        return response


@pytest.fixture
def fake_ray() -> Iterator[str]:
    fake = FakeRay()
    app = web.Application()
    app.router.add_get("/api/jobs/{job}/logs/tail", fake.tail)
    app.router.add_get("/api/v0/logs/file", fake.file)
    app.router.add_get("/api/jobs/{job}", fake.job)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=5.0)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)


# The dispatcher's side, in a process of its own: reads the job's log as reconcile does (stores the
# complete lines of each read, moves its offset by what it stored) and reports its memory.
READER = """
import json, sys, time
from api.dispatcher.ray_jobs import RayJobsBackend

def memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {name: int(fields[name].split()[0]) * 1024 for name in ("VmRSS", "VmHWM")}

address, mode = sys.argv[1], sys.argv[2]
backend = RayJobsBackend(address, token="ray-token", line_max_bytes=%(line_max)d, read_max_chars=1 << 20)
before = memory()
offset, stored, deadline = 0, [], time.monotonic() + 600
while time.monotonic() < deadline:
    final = mode == "final"
    if not final:
        backend.tails.follow("tm-flood") if "tm-flood" not in backend.tails.tails else None
        finished = backend.tails.finished("tm-flood")
    new = backend.logs("tm-flood", offset, final)
    done = (final and len(new) < backend.read_max_chars) or (not final and finished and not new)
    complete = new if done else new[: new.rfind("\\n") + 1]
    stored += complete.splitlines()
    offset += len(complete)
    if done:
        break
    if not final and not new:
        time.sleep(0.01)
shown = [line if len(line) < 100 else (line[:40], len(line), line[-40:]) for line in stored]
print(json.dumps({"before": before, "after": memory(), "lines": shown}))
"""


def _read(address: str, mode: str) -> dict:  # type: ignore[type-arg]
    script = READER % {"line_max": LINE_MAX}
    done = subprocess.run(
        [sys.executable, "-c", script, address, mode], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _expected_lines() -> list[str]:
    cut = "x" * LINE_MAX + f" … [cut: {FLOOD_BYTES - LINE_MAX} bytes]"
    return ["first line", [cut[:40], len(cut), cut[-40:]], "last line"]


@pytest.mark.parametrize("mode", ["tail", "final"])
def test_a_gigabyte_without_a_newline_leaves_the_dispatcher_bounded(fake_ray: str, mode: str) -> None:
    report = _read(fake_ray, mode)
    growth = report["after"]["VmHWM"] - report["before"]["VmRSS"]
    print(
        f"{mode}: {FLOOD_BYTES} bytes read; VmRSS before {report['before']['VmRSS']}, VmHWM after "
        f"{report['after']['VmHWM']}: grew {growth} bytes"
    )
    assert report["lines"] == _expected_lines()
    assert growth < GROWTH_MAX_BYTES, f"the reader's peak memory grew by {growth} bytes reading {FLOOD_BYTES}"
