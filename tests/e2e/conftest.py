"""Real processes: `trainmaster api` on a free port, against the session's migrated database."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.factories.auth import project_token
from trainmaster.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TRAINMASTER = str(Path(sys.executable).with_name("trainmaster"))


def wait_until(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@dataclass
class ApiProcess:
    url: str
    token: str
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    log_path: Path


def start_api(
    database_url: str,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    port: int | None = None,
    ready_s: float = 30,
) -> ApiProcess:
    port = port or free_port()
    env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url, **(extra_env or {})}
    log = log_path.open("ab")
    process = subprocess.Popen(
        [TRAINMASTER, "api", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"trainmaster api exited: {log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, ready_s, what="trainmaster api to be ready")
    token = project_token(database_url, "e2e")
    client_env = {**env, "TRAINMASTER_API_URL": url, "TRAINMASTER_TOKEN": token}
    return ApiProcess(url=url, token=token, env=client_env, process=process, log_path=log_path)


def stop(process: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """SIGTERM, and SIGKILL after `grace_s`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def api_process(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    api = start_api(database_url, tmp_path_factory.mktemp("api") / "api.log")
    yield api
    stop(api.process)


@dataclass
class Stack:
    api: ApiProcess
    ray: Any
    dispatchers: Any
    work_dir: Path
    storage: Path  # checkpoints: a root every cluster user may write its projects' folders in (osusers.shared_root)

    def client(self) -> Any:
        import trainmaster as tm

        return tm.Client(self.api.url, self.api.token)


@contextlib.contextmanager
def running_stack(
    pg_server_url: str, ray_head: Any, work_dir: Path, extra_env: dict[str, str] | None = None
) -> Iterator[Stack]:
    """API and one dispatcher on a database of their own, over `ray_head`."""
    from api.db import migrate
    from api.stack.osusers import shared_root
    from api.stack.postgres import create_database, create_login, drop_database, drop_login
    from tests.e2e.ray_stack import Dispatchers, secrets_path

    owner_url = create_database(pg_server_url, "tm_ray")
    migrate.upgrade(owner_url)
    # The API and the dispatcher connect as the least-privilege role (migration 0022), as a deployment
    # should: every real-process test then shows that role's rights are enough.
    database_url = create_login(pg_server_url, owner_url)
    ray_env = {
        "TRAINMASTER_RAY_ADDRESS": ray_head.dashboard,
        **{k: ray_head.env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")},
        "TRAINMASTER_SECRETS_PATH": str(secrets_path()),  # where other clusters' tokens are (start_ray_head)
    }
    api = start_api(database_url, work_dir / "api.log", extra_env=ray_env)
    # Outside pytest's private tmp folders: a cluster run as another OS user writes its checkpoints here.
    storage = shared_root(Path(tempfile.mkdtemp(prefix="tm-storage-", dir="/tmp")))
    env = {
        **ray_head.env,
        "TRAINMASTER_DATABASE_URL": database_url,
        "TRAINMASTER_RAY_ADDRESS": ray_head.dashboard,
        "TRAINMASTER_API_URL": api.url,
        "TRAINMASTER_STORAGE_PATH": str(storage),
        "TRAINMASTER_CODE_CACHE_PATH": str(work_dir / "code"),
        "TRAINMASTER_POLL_INTERVAL_S": "1",
        "TRAINMASTER_INFEASIBLE_TIMEOUT_S": "8",
        "TRAINMASTER_LEASE_S": "15",
        "TRAINMASTER_CHECKPOINT_GC_INTERVAL_S": "1",
        "TRAINMASTER_SECRETS_PATH": str(secrets_path()),
        **(extra_env or {}),
    }
    dispatchers = Dispatchers(env=env, log_dir=work_dir)
    dispatchers.start("d1")
    try:
        yield Stack(api=api, ray=ray_head, dispatchers=dispatchers, work_dir=work_dir, storage=storage)
    finally:
        dispatchers.stop_all()
        shutil.rmtree(storage, ignore_errors=True)
        stop(api.process)
        drop_database(pg_server_url, owner_url)
        drop_login(pg_server_url, database_url)
