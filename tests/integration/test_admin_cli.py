"""The admin verbs against a real API process, as a person runs them: `trainmaster cluster`, `project`,
`token ls|revoke`; a revoked token's open stream ends within 5 s; a job's token dies with its attempt."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import trainmaster as tm
from tests.e2e.conftest import TRAINMASTER, ApiProcess, start_api, stop
from tests.factories.auth import job_token, scoped_token
from tests.factories.http import bearer
from tests.factories.jobs import spec


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[ApiProcess]:
    process = start_api(database_url, tmp_path / "api.log")
    yield process
    stop(process.process)


def cli(api: ApiProcess, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**api.env, "TRAINMASTER_TOKEN": token, "COLUMNS": "200"}
    return subprocess.run([TRAINMASTER, *args], env=env, capture_output=True, text=True, timeout=60)


def test_clusters_projects_and_tokens_from_the_cli(api: ApiProcess, database_url: str) -> None:
    admin = scoped_token(database_url, "default", "admin")
    ray_a = "TRAINMASTER_CLUSTER_TOKEN_RAY_A"  # a cluster's token variable carries the reserved prefix
    added = cli(api, admin, "cluster", "add", "gpu-a", "--address", "http://ray-a:8265", "--token-env", ray_a)
    assert added.returncode == 0, added.stderr
    listed = cli(api, admin, "cluster", "ls", "--json")
    assert {c["name"]: c["token_env"] for c in json.loads(listed.stdout)} == {"default": None, "gpu-a": ray_a}

    created = cli(
        api, admin, "project", "create", "vision", "--cluster", "gpu-a", "--max-priority", "10", "--storage-quota", "1T"
    )
    assert created.returncode == 0, created.stderr
    changed = cli(api, admin, "project", "set", "vision", "--max-priority", "20")
    assert changed.returncode == 0, changed.stderr
    projects = {p["name"]: p for p in json.loads(cli(api, admin, "project", "ls", "--json").stdout)}
    assert projects["vision"]["cluster"] == "gpu-a" and projects["vision"]["max_priority"] == 20
    assert projects["vision"]["storage_quota_bytes"] == 1024**4
    quota = cli(api, admin, "project", "set", "vision", "--quota", "GPU=8,CPU=64", "--cohort", "research")
    assert quota.returncode == 0, quota.stderr
    assert "quota CPU=64,GPU=8, cohort research" in quota.stdout
    limited = cli(api, admin, "project", "set", "vision", "--borrowing-limit", "GPU=2", "--cohort", "none")
    assert limited.returncode == 0, limited.stderr
    vision = next(p for p in json.loads(cli(api, admin, "project", "ls", "--json").stdout) if p["name"] == "vision")
    assert vision["quota"] == {"GPU": 8, "CPU": 64} and vision["borrowing_limit"] == {"GPU": 2}
    assert vision["cohort"] is None
    assert "CPU=64,GPU=8" in cli(api, admin, "project", "ls").stdout
    kept = cli(api, admin, "project", "set", "vision", "--checkpoint-retention-days", "7.5")
    assert kept.returncode == 0 and "checkpoints of finished jobs kept 7.5 days" in kept.stdout, kept.stderr
    forever = cli(api, admin, "project", "set", "vision", "--checkpoint-retention-days", "none")
    assert forever.returncode == 0 and "kept forever" in forever.stdout, forever.stderr
    bad_days = cli(api, admin, "project", "set", "vision", "--checkpoint-retention-days", "soon")
    assert bad_days.returncode == 1 and "takes a number of days or 'none'" in bad_days.stderr, bad_days.stderr
    sized = cli(api, admin, "project", "set", "vision", "--storage-quota", "2G")
    assert sized.returncode == 0 and "storage quota 2.0 GB" in sized.stdout, sized.stderr
    storage = cli(api, admin, "storage")
    assert storage.returncode == 0, storage.stderr
    rows = [line.replace("│", " ").split() for line in storage.stdout.splitlines()]
    assert ["vision", "0", "B", "2.0", "GB", "0%"] in [row[:6] for row in rows], storage.stdout
    as_json = {row["project"]: row for row in json.loads(cli(api, admin, "storage", "--json").stdout)}
    assert as_json["vision"]["quota_bytes"] == 2 * 1024**3 and as_json["vision"]["used_bytes"] == 0
    bad_size = cli(api, admin, "project", "set", "vision", "--storage-quota", "lots")
    assert bad_size.returncode == 1 and "--storage-quota takes a size or 'none'" in bad_size.stderr, bad_size.stderr
    unlimited = cli(api, admin, "project", "set", "vision", "--storage-quota", "none")
    assert unlimited.returncode == 0 and "storage quota unlimited" in unlimited.stdout, unlimited.stderr
    for bad, says in ((("--quota", "GPU"), "--quota takes RESOURCE=AMOUNT"), (("--quota", "memory=1"), "quota")):
        refused = cli(api, admin, "project", "set", "vision", *bad)
        assert refused.returncode == 1 and says in refused.stderr, (bad, refused.stderr)
    queue = cli(api, admin, "queue")  # the admin's own cluster (default): vision is on gpu-a
    assert queue.returncode == 0, queue.stderr
    assert "cluster default" in queue.stdout and "vision" not in queue.stdout and "default" in queue.stdout
    as_json = json.loads(cli(api, admin, "queue", "--json").stdout)
    assert as_json["cluster"] == "default" and "vision" not in {item["project"] for item in as_json["items"]}

    denied = cli(api, api.token, "cluster", "ls")  # a project token
    assert denied.returncode == 1 and "403" in denied.stderr and "next: this needs another token" in denied.stderr
    with tm.Admin(api.url, api.token) as sdk, pytest.raises(tm.Forbidden):  # the SDK's own class for a 403
        sdk.clusters()

    made = subprocess.run(
        [TRAINMASTER, "token", "create", "--project", "vision", "--scope", "metrics", "--user", "prom"],
        env=api.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert httpx.get(f"{api.url}/metrics", headers=bearer(secret)).status_code == 200
    tokens = json.loads(cli(api, admin, "token", "ls", "--json").stdout)
    mine = next(t for t in tokens if t["user"] == "prom")
    assert mine["scope"] == "metrics" and mine["project"] == "vision" and mine["expires_at"] is None
    assert mine["last_used_at"] is not None  # the scrape above
    table = cli(api, admin, "token", "ls").stdout
    assert mine["id"][:8] in table and "prom" in table

    revoked = cli(api, admin, "token", "revoke", mine["id"][:8])  # a prefix is enough
    assert revoked.returncode == 0, revoked.stderr
    assert httpx.get(f"{api.url}/metrics", headers=bearer(secret)).status_code == 401
    assert mine["id"] not in cli(api, admin, "token", "ls", "--json").stdout


def test_a_revoked_tokens_open_stream_ends_within_5_s(api: ApiProcess, database_url: str) -> None:
    headers = bearer(api.token)
    job = httpx.post(f"{api.url}/v1/jobs", json=spec(), headers=headers).json()
    admin = bearer(scoped_token(database_url, "default", "admin"))
    token_id = next(t["id"] for t in httpx.get(f"{api.url}/v1/tokens", headers=headers).json()["items"])
    opened, ended = threading.Event(), threading.Event()
    lines: list[str] = []

    def read() -> None:
        url = f"{api.url}/v1/jobs/{job['id']}/metrics/stream"
        with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(30, read=60)) as response:
            opened.set()
            lines.extend(response.iter_lines())
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert opened.wait(10)
    time.sleep(0.5)
    assert not ended.is_set()  # a queued job's stream stays open
    assert httpx.delete(f"{api.url}/v1/tokens/{token_id}", headers=admin).status_code == 204
    revoked_at = time.monotonic()
    assert ended.wait(5), "the stream outlived its token by 5 s"
    assert time.monotonic() - revoked_at < 5
    assert not any(line.startswith("event: end") for line in lines)  # cut off, not a job that ended
    assert httpx.get(f"{api.url}/v1/jobs", headers=headers).status_code == 401


def test_the_dispatcher_revokes_a_jobs_tokens_when_its_attempt_is_released(api: ApiProcess, database_url: str) -> None:
    from api.db.models import Job
    from api.db.session import create_engine, session_factory
    from api.dispatcher.ending import release
    from api.settings import Settings

    headers = bearer(api.token)
    job_id = httpx.post(f"{api.url}/v1/jobs", json=spec(), headers=headers).json()["id"]
    secret = bearer(job_token(database_url, job_id))
    points = {"points": [{"step": 1, "values": {"loss": 1.0}}]}
    assert httpx.post(f"{api.url}/v1/jobs/{job_id}/metrics", json=points, headers=secret).status_code == 201

    async def end_attempt() -> None:  # what finish() and fail_launch() do before the status change
        engine = create_engine(Settings(database_url=database_url))
        async with session_factory(engine)() as session, session.begin():
            job = await session.get(Job, uuid.UUID(job_id))
            assert job is not None
            await release(session, job)
        await engine.dispose()

    asyncio.run(end_attempt())
    assert httpx.post(f"{api.url}/v1/jobs/{job_id}/metrics", json=points, headers=secret).status_code == 401
