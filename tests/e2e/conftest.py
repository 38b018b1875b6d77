"""Real processes for the e2e tests: the API on the session's database, and a whole stack over a Ray head
(the code that starts them is tests/factories/processes.py, shared with bench/)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.factories.processes import REPO as REPO
from tests.factories.processes import TRAINMASTER as TRAINMASTER
from tests.factories.processes import ApiProcess, start_api, stop
from tests.factories.waiting import wait_until as wait_until  # test files import it from here


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
    from tests.factories.processes import Dispatchers, secrets_path

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
