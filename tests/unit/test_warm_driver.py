"""workers/warm/: the warm driver's client, server and forked child, as real processes (no Ray).

The server runs a test target (TRAINMASTER_WARM_TARGET) in place of workers.driver:main, so a job can
print what it saw, exit with a given status or wait to be stopped. The server really imports Ray Train
first, as it does for jobs. Real-Ray jobs through the warm server: tests/e2e/test_ray_jobs.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import wait_until
from workers import warm
from workers.warm.client import server_env, socket_path
from workers.warm.server import cold_reason

TARGET = textwrap.dedent(
    """
    import json, os, sys, time

    def main(argv):
        record = {
            "pid": os.getpid(), "cwd": os.getcwd(), "argv": argv, "job": os.environ.get("TRAINMASTER_JOB_ID"),
            "start": json.loads(os.environ.get("TRAINMASTER_DRIVER_START") or "{}"), "path": sys.path[:2],
        }
        print(json.dumps(record), flush=True)
        if argv[:1] == ["sleep"]:
            time.sleep(120)
        return int(argv[1]) if argv[:1] == ["exit"] else 0
    """
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of a job whose node has a warm server for the test target (the first job on a
    node starts it, cold, and says so)."""
    root = tmp_path_factory.mktemp("warm")
    (root / "lib").mkdir()
    (root / "lib" / "warm_target.py").write_text(TARGET)
    (root / "job").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINMASTER_", "RAY_", "PYTHONPATH"))}
    env.update(
        TRAINMASTER_WARM_DIR=str(root / "sockets"),
        TRAINMASTER_WARM_TARGET="warm_target:main",
        TRAINMASTER_WARM_IDLE_S="300",
        TRAINMASTER_JOB_ID="job-1",
        PYTHONPATH=str(root / "lib"),
        JOB_CWD=str(root / "job"),
    )
    first = run(env, "a", "b")
    assert first.returncode == 0, first.stderr
    record = json.loads(first.stdout.splitlines()[-1])
    assert record["start"]["warm"] is False
    assert "no warm server was running" in record["start"]["reason"]
    assert record["argv"] == ["a", "b"]
    sockets = root / "sockets"
    wait_until(lambda: list(sockets.glob("*.sock")), 120, interval=0.2, what="the warm server to listen")
    assert (sockets.stat().st_mode & 0o777) == 0o700  # the jobs' environments carry their tokens
    yield env
    for log in sockets.glob("*.log"):  # every server the tests started, listening yet or not
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(json.loads(log.read_text().splitlines()[0])["pid"]), signal.SIGTERM)


def run(env: dict[str, str], *args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.warm", *args],
        env=env,
        cwd=cwd or env["JOB_CWD"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def record_of(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout.splitlines()[-1])


def test_a_job_runs_in_a_forked_child_with_its_own_environment_directory_and_status(setup: dict[str, str]) -> None:
    env = {**setup, "TRAINMASTER_JOB_ID": "job-2"}
    done = run(env, "exit", "3")
    assert done.returncode == 3, done.stderr
    record = record_of(done)
    assert record["start"]["warm"] is True, record
    assert record["job"] == "job-2"  # the job's own variables, not those of the job that started the server
    assert record["cwd"] == setup["JOB_CWD"] and record["path"][0] == setup["JOB_CWD"]
    assert record["argv"] == ["exit", "3"]


def test_stop_signals_reach_the_child_and_the_client_dies_the_same_way(setup: dict[str, str]) -> None:
    client = subprocess.Popen(
        [sys.executable, "-m", "workers.warm", "sleep"], env=setup, cwd=setup["JOB_CWD"], stdout=subprocess.PIPE
    )
    assert client.stdout is not None
    record = json.loads(client.stdout.readline())
    assert record["start"]["warm"] is True and record["pid"] != client.pid
    title = Path(f"/proc/{record['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "-m warm_target sleep" in title, title  # ps shows the job's driver, not the server it came from
    client.send_signal(signal.SIGTERM)  # what Ray's stop_job sends the entrypoint
    assert client.wait(timeout=30) == -signal.SIGTERM
    wait_until(lambda: not Path(f"/proc/{record['pid']}").exists(), 30, interval=0.1, what="the child to end")


def test_a_killed_client_takes_its_child_with_it(setup: dict[str, str]) -> None:
    client = subprocess.Popen(
        [sys.executable, "-m", "workers.warm", "sleep"], env=setup, cwd=setup["JOB_CWD"], stdout=subprocess.PIPE
    )
    assert client.stdout is not None
    record = json.loads(client.stdout.readline())
    # Forked by the server, not the client itself exec'd cold: only then can killing the client miss it.
    assert record["start"]["warm"] is True and record["pid"] != client.pid, record
    assert Path(f"/proc/{record['pid']}").exists()
    client.kill()
    assert client.wait(timeout=30) == -signal.SIGKILL
    wait_until(lambda: not Path(f"/proc/{record['pid']}").exists(), 30, interval=0.1, what="the orphaned child to end")


def test_jobs_the_server_cannot_serve_start_cold_and_say_why(setup: dict[str, str], tmp_path: Path) -> None:
    spec_env = {**setup, "RAY_TEST_FLAG": "1", "TRAINMASTER_JOB_SPEC": json.dumps({"env": {"RAY_TEST_FLAG": "1"}})}
    reason = record_of(run(spec_env))["start"]["reason"]
    assert reason == "its RAY_TEST_FLAG differs from the warm server's"

    pip = {**setup, "TRAINMASTER_JOB_SPEC": json.dumps({"pip": ["requests"]})}
    assert "pip" in record_of(run(pip))["start"]["reason"]

    (tmp_path / "platform").mkdir()  # a folder without __init__.py shadows nothing (this repo has one)
    assert record_of(run(setup, cwd=str(tmp_path)))["start"]["warm"] is True
    (tmp_path / "trainmaster").symlink_to(Path(warm.__file__).parents[2] / "trainmaster")
    assert record_of(run(setup, cwd=str(tmp_path)))["start"]["warm"] is True  # the very file the server has
    (tmp_path / "ray").mkdir()  # the job's own package `ray` would shadow the one the server imported
    (tmp_path / "ray" / "__init__.py").write_text("")
    shadowed = record_of(run(setup, cwd=str(tmp_path)))["start"]
    assert shadowed["warm"] is False and "module named 'ray'" in shadowed["reason"]


def test_the_environment_rules() -> None:
    server = {"RAY_AUTH_MODE": "token", "PATH": "/bin", "PYTHONPATH": "/lib"}
    job = {**server, "TRAINMASTER_JOB_TOKEN": "t", "RAY_JOB_CONFIG_JSON_ENV_VAR": "{}", "HF_HOME": "/h"}
    assert cold_reason(server, {**job, "PYTHONPATH": "/code:/lib"}, "/code", {}) is None
    assert cold_reason(server, {**job, "PYTHONPATH": "/other:/lib"}, "/code", {}) is None  # Ray's working_dir
    assert cold_reason(server, {**job, "PYTHONPATH": "/code"}, "/code", {}) == (
        "its PYTHONPATH differs from the warm server's"
    )
    assert cold_reason(server, {**job, "RAY_AUTH_MODE": "disabled"}, "/code", {}) == (
        "its RAY_AUTH_MODE differs from the warm server's"
    )
    assert cold_reason(server, {**job, "LD_PRELOAD": "x.so"}, "/code", {}) is not None
    spec = json.dumps({"env": {"RAY_X": "1", "HF_HOME": "/h"}})
    started = server_env({**job, "RAY_X": "1", "TRAINMASTER_JOB_SPEC": spec, "PYTHONPATH": "/code:/lib"}, "/code")
    assert started == {"RAY_AUTH_MODE": "token", "PATH": "/bin", "PYTHONPATH": "/lib"}
    assert socket_path(started) == socket_path({**started, "HF_HOME": "/elsewhere"})
    assert socket_path(started) != socket_path({**started, "RAY_AUTH_MODE": "disabled"})


def test_a_server_that_cannot_start_is_not_retried_by_every_job(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    # Importable in a job (its own `env` sets IN_JOB), not in the server (which never has a job's env).
    guard = "if not os.environ.get('IN_JOB'):\n    raise ImportError('not in the server')\n"
    (tmp_path / "lib" / "job_only.py").write_text("import os\n" + guard + TARGET)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINMASTER_", "RAY_", "PYTHONPATH"))}
    env.update(
        TRAINMASTER_WARM_DIR=str(tmp_path / "sockets"),
        TRAINMASTER_WARM_TARGET="job_only:main",
        TRAINMASTER_JOB_SPEC=json.dumps({"env": {"IN_JOB": "1"}}),
        IN_JOB="1",
        PYTHONPATH=str(tmp_path / "lib"),
        JOB_CWD=str(tmp_path),
    )
    assert "no warm server was running" in record_of(run(env))["start"]["reason"]
    log = next((tmp_path / "sockets").glob("*.log"))
    wait_until(lambda: "not in the server" in log.read_text(), 120, interval=0.2, what="the server to fail")
    wait_until(lambda: not list((tmp_path / "sockets").glob("*.starting")), 30, what="its start lock to go")
    assert record_of(run(env))["start"]["reason"] == f"the node's warm server failed recently; see {log}"


def test_an_idle_server_exits_and_removes_its_socket(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINMASTER_", "RAY_"))}
    env.update(TRAINMASTER_WARM_DIR=str(tmp_path / "sockets"), TRAINMASTER_WARM_IDLE_S="1")
    env["RAY_ADDRESS"] = "127.0.0.1:9"  # nothing listens: the server's cluster is gone too
    path = tmp_path / "sockets" / "idle.sock"
    path.parent.mkdir(mode=0o700)
    server = subprocess.Popen([sys.executable, "-m", "workers.warm", "--serve", str(path)], env=env, cwd=tmp_path)
    assert server.wait(timeout=120) == 0
    assert not path.exists() and not path.with_suffix(".log").exists()
