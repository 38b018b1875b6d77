"""`tm.AsyncClient` against the real API served over real HTTP (uvicorn on loopback) on a real
PostgreSQL: its whole surface, the errors and retries it shares with `tm.Client`, and `submit`'s typed
keywords in both clients. No Ray: jobs stay queued, or the test moves them as the dispatcher would."""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest
import uvicorn
from fastapi.testclient import TestClient

import trainmaster as tm
from api.app import create_app
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.database import finish
from tests.factories.http import falling_losses, post_losses
from tests.integration.conftest import count_jobs
from tests.integration.faulty_proxy import Fault, FaultyProxy

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(scenario())  # type: ignore[arg-type]


@pytest.fixture
def live_url(settings: Settings) -> Iterator[str]:
    """The real app served by uvicorn on a loopback port, in a thread, lifespan included."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    # No Ray (its address refuses); a job finished by a test's UPDATE (no NOTIFY) is seen within 0.5 s.
    app = create_app(settings.model_copy(update={"ray_address": "http://127.0.0.1:9", "sse_heartbeat_s": 0.5}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def client(url: str, token: str) -> tm.AsyncClient:
    return tm.AsyncClient(url, token, timeout=10)


def test_submit_typed_keywords_and_spec_get_list_cancel_events(live_url: str, token: str) -> None:
    async def scenario() -> None:
        async with client(live_url, token) as sdk:
            typed = await sdk.submit(
                name="typed",
                entrypoint="builtin:mlp",
                scaling=tm.Scaling(num_workers=2),
                config={"epochs": 1},
                labels={"team": "nlp"},
                priority=5,
                max_retries=2,
                timeout_s=60.0,
                env={"A": "1"},
            )
            assert isinstance(typed, tm.AsyncJobHandle) and typed.status is tm.JobStatus.queued
            spec = typed.info.spec
            assert spec["scaling"]["num_workers"] == 2 and spec["priority"] == 5 and spec["max_retries"] == 2
            assert spec["timeout_s"] == 60.0 and spec["env"] == {"A": "1"}
            from_spec = await sdk.submit(tm.JobSpec(name="from-spec", entrypoint="builtin:mlp"), priority=3)
            assert from_spec.info.spec["name"] == "from-spec" and from_spec.info.spec["priority"] == 3

            got = await sdk.get(typed.id)
            assert got.name == "typed" and repr(got).startswith("AsyncJobHandle(")
            assert await sdk.resolve_id(typed.id[:8]) == typed.id
            assert [job.id async for job in sdk.list(labels={"team": "nlp"})] == [typed.id]
            assert [job.id async for job in sdk.list(status=["queued"])] == [from_spec.id, typed.id]

            assert (await typed.cancel()).status is tm.JobStatus.cancelled
            assert typed.status is tm.JobStatus.cancelled
            assert [e.status for e in await typed.events()] == [tm.JobStatus.queued, tm.JobStatus.cancelled]
            assert [job.id async for job in sdk.list(status="cancelled")] == [typed.id]
            assert await typed.checkpoints() == []
            cluster = await sdk.cluster()  # Ray's address refuses: reported, with the queue counted anyway
            assert cluster.name == "default" and not cluster.reachable and cluster.error and cluster.nodes == []
            assert (cluster.queue_depth, cluster.project_queue_depth) == (1, 1)  # from_spec waits; typed was cancelled
        assert sdk.closed

    run(scenario)


def test_list_follows_cursors_up_to_the_limit(live_url: str, token: str) -> None:
    async def scenario() -> None:
        async with client(live_url, token) as sdk:
            ids = [(await sdk.submit(name=f"j{i}", entrypoint="builtin:mlp")).id for i in range(5)]
            assert [job.id async for job in sdk.list(page_size=2)] == list(reversed(ids))
            assert [job.id async for job in sdk.list(page_size=2, limit=3)] == list(reversed(ids))[:3]

    run(scenario)


def test_wait_returns_on_success_and_raises_job_failed(live_url: str, token: str, database_url: str) -> None:
    async def scenario() -> None:
        async with client(live_url, token) as sdk:
            ok = await sdk.submit(name="ok", entrypoint="builtin:mlp")
            later = asyncio.get_running_loop().call_later(0.3, finish, database_url, ok.id, "succeeded")
            assert (await ok.wait(timeout=10, poll_interval=0.05)).status is tm.JobStatus.succeeded
            later.cancel()
            bad = await sdk.submit(name="bad", entrypoint="builtin:mlp")
            finish(database_url, bad.id, "failed", "CUDA out of memory on rank 1")
            with pytest.raises(tm.JobFailed, match="CUDA out of memory"):
                await bad.wait(timeout=10, poll_interval=0.05)
            assert bad.status is tm.JobStatus.failed
            slow = await sdk.submit(name="slow", entrypoint="builtin:mlp")
            with pytest.raises(tm.WaitTimeout):
                await sdk.wait(slow.id, timeout=0.2, poll_interval=0.05)

    run(scenario)


def test_logs_and_metrics_page_through_everything(live_url: str, token: str, database_url: str) -> None:
    async def scenario() -> str:
        async with client(live_url, token) as sdk:
            job = await sdk.submit(name="chatty", entrypoint="builtin:mlp")
            with psycopg.connect(libpq(database_url)) as conn:
                conn.execute(
                    "INSERT INTO log_lines (job_id, attempt, source, line)"
                    " SELECT %s, 1, 'driver', 'line ' || g FROM generate_series(1, 2500) AS g ORDER BY g",
                    (job.id,),
                )
            expected = [f"line {n}" for n in range(1, 2501)]
            assert [line.line async for line in job.logs(page_size=1000)] == expected
            return job.id

    job_id = run(scenario)
    with TestClient(create_app(Settings(database_url=database_url))) as http:
        post_losses(http, token, job_id, falling_losses(0, 25))

    async def metrics() -> None:
        async with client(live_url, token) as sdk:
            values = [value async for value in sdk.iter_metrics(job_id, page_size=7)]
            seqs = [value.seq for value in values]
            assert len(seqs) == 25 and seqs == sorted(set(seqs))
            assert [value.seq for value in await sdk.metrics(job_id)] == seqs
            assert [v.step async for v in sdk.iter_metrics(job_id, since_step=20)] == [20, 21, 22, 23, 24]
            # max_points=5: two buckets of the 25 points (steps 0-12 and 13-24), each keeping its highest
            # and its lowest value; loss = 1 / (step + 1) falls, so each bucket's first and last step.
            downsampled = await sdk.metrics(job_id, names=["loss"], max_points=5)
            assert [(value.name, value.step) for value in downsampled] == [("loss", s) for s in (0, 12, 13, 24)]
            assert [value.value for value in downsampled] == pytest.approx([1 / (s + 1) for s in (0, 12, 13, 24)])

    run(metrics)


def test_metric_and_log_streams_end_at_end(live_url: str, token: str, database_url: str, http: TestClient) -> None:
    async def scenario(job_id: str) -> None:
        async with client(live_url, token) as sdk:
            later = asyncio.get_running_loop().call_later(0.5, finish, database_url, job_id, "succeeded")
            streamed = [value.step async for value in sdk.stream_metrics(job_id)]
            later.cancel()
            assert streamed == list(range(30))
            assert [value.step async for value in sdk.stream_metrics(job_id, after_seq=None)] == list(range(30))
            handle = await sdk.get(job_id)
            assert [line.line async for line in handle.logs(follow=True)] == ["hello", "bye"]

    with tm.Client("http://testserver", token, transport=http._transport) as sync:
        job = sync.submit(name="streamed", entrypoint="builtin:mlp")
    post_losses(http, token, job.id, falling_losses(0, 30))
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute(
            "INSERT INTO log_lines (job_id, attempt, source, line) VALUES (%s, 1, 'driver', 'hello'),"
            " (%s, 1, 'driver', 'bye')",
            (job.id, job.id),
        )
    run(lambda: scenario(job.id))


def test_working_dir_is_uploaded_once_then_found_already_uploaded(
    live_url: str, token: str, database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")

    async def scenario() -> None:
        async with client(live_url, token) as sdk:
            first = await sdk.submit(name="code", entrypoint="script:train.py", working_dir=tmp_path)
            code = first.info.spec["code"]
            assert code.startswith("sha256:")
            again = await sdk.upload_code(tmp_path)  # answered by HEAD /v1/code/{id}: not sent again
            assert again.id == code and again.file_count == 2
            second = await sdk.submit(name="code-again", entrypoint="script:train.py", working_dir=str(tmp_path))
            assert second.info.spec["code"] == code

    run(scenario)
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM code_packages").fetchone()
    assert row is not None and row[0] == 1


def test_sweeps(live_url: str, token: str) -> None:
    async def scenario() -> None:
        async with client(live_url, token) as sdk:
            sweep = await sdk.sweep(
                {"name": "toy", "entrypoint": "builtin:toy-curve", "config": {"steps": 10, "step_s": 0.0}},
                parameters={"hidden": {"values": [32, 64]}},
                metric="loss",
                mode="min",
                max_concurrent=1,
            )
            assert sweep.info.name == "toy" and sweep.status.value == "running"
            assert (await sdk.get_sweep(sweep.id)).id == sweep.id
            assert [s.id for s in await sdk.sweeps()] == [sweep.id]
            assert [s.id for s in await sdk.sweeps(status="running", limit=5)] == [sweep.id]
            assert (await sweep.cancel()).status.value == "cancelled"
            assert (await sweep.wait(timeout=5, poll_interval=0.05)).status.value == "cancelled"
            assert (await sweep.refresh()).status.value == "cancelled" and sweep.best is None

    run(scenario)


def test_errors_map_to_the_same_exceptions_as_the_sync_client(live_url: str, token: str) -> None:
    async def scenario() -> None:
        async with client(live_url, token) as sdk:
            with pytest.raises(tm.JobNotFound) as missing:
                await sdk.get("00000000-0000-0000-0000-000000000000")
            assert missing.value.response is not None and missing.value.response.status_code == 404
            with pytest.raises(tm.ValidationFailed, match="entrypoint"):
                await sdk.submit(tm.JobSpec.model_construct(name="x", entrypoint="not an entrypoint"))
            job = await sdk.submit(name="c", entrypoint="builtin:mlp")
            await job.cancel()
            with pytest.raises(tm.Conflict):
                await job.cancel()
            with pytest.raises(tm.JobNotFound):  # at once: 404 is no passing failure
                async for _ in sdk.stream_metrics("00000000-0000-0000-0000-000000000000", retry_for=60):
                    pass
        async with client(live_url, "tm_wrong") as bad:
            with pytest.raises(tm.Unauthorized):
                await bad.get(job.id)
            with pytest.raises(tm.Unauthorized):
                [line async for line in bad.logs(job.id)]
        async with client("http://127.0.0.1:9", token) as nobody:
            with pytest.raises(tm.ConnectionFailed, match="trainmaster up"):
                await nobody.get(job.id)

    run(scenario)


def test_a_503_is_retried_after_retry_after_and_a_401_raises_at_once(
    http: TestClient, token: str, database_url: str
) -> None:
    proxy = FaultyProxy(http._transport)
    proxy.plan.extend([Fault(503, retry_after="1"), Fault(503)])
    proxy.start()
    try:

        async def scenario() -> None:
            async with client(proxy.url, token) as sdk:
                job = await sdk.submit(name="through-503s", entrypoint="builtin:mlp")  # 503, 503, 201
                proxy.plan.append(Fault(401, "Unauthorized"))
                with pytest.raises(tm.Unauthorized):
                    await sdk.wait(job.id, timeout=30, poll_interval=0.05)
                finish(database_url, job.id, "succeeded")
                assert (await sdk.wait(job.id, timeout=30)).status is tm.JobStatus.succeeded

        run(scenario)
    finally:
        proxy.stop()
    assert proxy.statuses() == [503, 503, 201, 401, 200]
    assert proxy.answered[1][0] - proxy.answered[0][0] >= 0.9  # Retry-After: 1 honoured
    assert count_jobs(database_url) == 1


def test_submit_takes_exactly_jobspec_fields_typed_in_both_clients() -> None:
    for method in (tm.Client.submit, tm.AsyncClient.submit):
        parameters = inspect.signature(method).parameters
        sdk_only = {"self", "spec", "working_dir", "idempotency_key", "include_secrets", "include_git"}
        assert set(parameters) - sdk_only == set(tm.JobSpec.model_fields)
        assert all(p.annotation is not inspect.Parameter.empty for p in parameters.values() if p.name != "self")
    assert inspect.signature(tm.Client.submit).parameters == inspect.signature(tm.AsyncClient.submit).parameters
    with tm.Client("http://127.0.0.1:9", "tm_x") as sync, pytest.raises(TypeError, match="nme"):
        sync.submit(nme="typo", entrypoint="builtin:mlp")  # type: ignore[call-arg]

    async def scenario() -> None:
        async with tm.AsyncClient("http://127.0.0.1:9", "tm_x") as sdk:
            with pytest.raises(TypeError, match="nme"):
                await sdk.submit(nme="typo", entrypoint="builtin:mlp")  # type: ignore[call-arg]

    run(scenario)


def test_mypy_sees_the_keywords_of_submit(tmp_path: Path) -> None:
    usage = tmp_path / "usage.py"
    usage.write_text(
        "import trainmaster as tm\n"
        "def sync(c: tm.Client) -> None:\n"
        "    c.submit(name='a', entrypoint='builtin:mlp', priority=1, working_dir='.')\n"
        "    c.submit(nme='a')\n"
        "    c.submit(name='a', priority='high')\n"
        "async def later(c: tm.AsyncClient) -> tm.AsyncJobHandle:\n"
        "    c.list(limt=3)\n"
        "    return await c.submit(tm.JobSpec(name='a', entrypoint='builtin:mlp'), scaling=tm.Scaling())\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", str(REPO / "pyproject.toml"), str(usage)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "MYPYPATH": str(REPO)},
        timeout=300,
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["4", "5", "7"], result.stdout
    assert 'Unexpected keyword argument "nme"' in errors[0] and '"priority"' in errors[1]
    assert 'Unexpected keyword argument "limt"' in errors[2]


def test_async_example_runs(live_url: str, token: str) -> None:
    env = {**os.environ, "TRAINMASTER_API_URL": live_url, "TRAINMASTER_TOKEN": token}
    result = subprocess.run(
        [sys.executable, "examples/api/async_sdk.py"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(line for line in lines if line.startswith("submitted")) == [
        "submitted async-0.001 queued",
        "submitted async-0.01 queued",
        "submitted async-0.1 queued",
    ]
    assert sum(line.startswith("queued async-") for line in lines) == 3
    assert "async-0.1 ['queued', 'cancelled']" in lines
