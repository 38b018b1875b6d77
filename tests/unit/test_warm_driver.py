"""workers/warm/: the warm driver's client, server and forked child, as real processes (no Ray).

The server runs a test target (TRAINMASTER_WARM_TARGET) in place of workers.driver:main, so a job can
print what it saw, exit with a given status or wait to be stopped. The server really imports Ray Train
first, as it does for jobs. A job's environment is built as Ray's job supervisor builds a driver's
(`ray_job`: the declared variables, recorded in RAY_JOB_CONFIG_JSON_ENV_VAR, beside the node's).
Real-Ray jobs through the warm server: tests/e2e/test_ray_jobs.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.factories.waiting import wait_until
from workers import warm
from workers.warm import RAY_JOB_CONFIG, read_secret, secret_path
from workers.warm.client import ask, declared_env, server_env, socket_path
from workers.warm.server import cold_reason, peer_refusal

OTHER_UID = 65534  # nobody: no entry in /etc/passwd is needed to run as it

TARGET = textwrap.dedent(
    """
    import json, os, sys, time

    def main(argv):
        record = {
            "pid": os.getpid(), "cwd": os.getcwd(), "argv": argv, "job": os.environ.get("TRAINMASTER_JOB_ID"),
            "start": json.loads(os.environ.get("TRAINMASTER_DRIVER_START") or "{}"), "path": sys.path[:2],
            "env": dict(os.environ),
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
    env = node_env()
    env.update(
        TRAINMASTER_WARM_DIR=str(root / "sockets"),
        TRAINMASTER_WARM_TARGET="warm_target:main",
        TRAINMASTER_WARM_IDLE_S="300",
        PYTHONPATH=str(root / "lib"),
        JOB_CWD=str(root / "job"),
    )
    env = ray_job(env, TRAINMASTER_JOB_ID="job-1")
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


def node_env() -> dict[str, str]:
    """This process's environment less what belongs to a job or a Ray cluster."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TRAINMASTER_", "RAY_", "PYTHONPATH"))}


def ray_job(env: dict[str, str], **declared: str) -> dict[str, str]:
    """`env` as Ray's job supervisor gives it to a driver whose runtime_env declares `declared`."""
    config = {"runtime_env": {"env_vars": declared}, "metadata": {}}
    return {**env, **declared, RAY_JOB_CONFIG: json.dumps(config)}


def the_socket(env: dict[str, str]) -> Path:
    (path,) = Path(env["TRAINMASTER_WARM_DIR"]).glob("*.sock")
    return path


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
    env = ray_job(setup, TRAINMASTER_JOB_ID="job-2")
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
    spec = json.dumps({"env": {"RAY_TEST_FLAG": "1"}})
    spec_env = ray_job(setup, RAY_TEST_FLAG="1", TRAINMASTER_JOB_SPEC=spec)
    reason = record_of(run(spec_env))["start"]["reason"]
    assert reason == "its RAY_TEST_FLAG differs from the warm server's"

    pip = ray_job(setup, TRAINMASTER_JOB_SPEC=json.dumps({"pip": ["requests"]}))
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

    declared = {"TRAINMASTER_JOB_ID": "j", "TRAINMASTER_JOB_TOKEN": "t", "RAY_DEDUP_LOGS": "0"}
    node = {"PATH": "/bin", "HOME": "/root", "TRAINMASTER_DATABASE_URL": "postgresql://u:pw@db/x", "AWS_KEY": "k"}
    driver = {"RAY_ADDRESS": "10.0.0.1:6379", "PYTHONUNBUFFERED": "1", "PYTHONPATH": "/code"}
    caller = ray_job({**node, **driver, "HF_HOME": "/h"}, **declared)
    sent = declared_env(caller, {"env": {"HF_HOME": "/h"}})
    assert sent == {**declared, **driver, "HF_HOME": "/h", "PATH": "/bin", RAY_JOB_CONFIG: caller[RAY_JOB_CONFIG]}
    assert declared_env(node, {}) is None  # not started by Ray's job supervisor: nothing is declared


def test_a_server_that_cannot_start_is_not_retried_by_every_job(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    # Importable in a job (its own `env` sets IN_JOB), not in the server (which never has a job's env).
    guard = "if not os.environ.get('IN_JOB'):\n    raise ImportError('not in the server')\n"
    (tmp_path / "lib" / "job_only.py").write_text("import os\n" + guard + TARGET)
    env = node_env()
    env.update(
        TRAINMASTER_WARM_DIR=str(tmp_path / "sockets"),
        TRAINMASTER_WARM_TARGET="job_only:main",
        PYTHONPATH=str(tmp_path / "lib"),
        JOB_CWD=str(tmp_path),
    )
    env = ray_job(env, TRAINMASTER_JOB_SPEC=json.dumps({"env": {"IN_JOB": "1"}}), IN_JOB="1")
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


def test_the_child_sees_only_the_declared_environment(setup: dict[str, str]) -> None:
    """A variable of the caller's (the node's, Ray's supervisor's) that the job did not declare never
    reaches the server or the forked driver; the declared ones do."""
    spec = json.dumps({"env": {"MY_FLAG": "on"}})
    declared = {"TRAINMASTER_JOB_ID": "job-env", "TRAINMASTER_JOB_TOKEN": "tok", "TRAINMASTER_JOB_SPEC": spec}
    env = ray_job(setup, **declared, MY_FLAG="on")
    env.update(TRAINMASTER_DATABASE_URL="postgresql://admin:hunter2@db/trainmaster", UNDECLARED_SECRET="s3cret")
    record = record_of(run(env))
    assert record["start"]["warm"] is True, record
    seen = record["env"]
    assert {name: seen.get(name) for name in [*declared, "MY_FLAG"]} == {**declared, "MY_FLAG": "on"}
    assert "TRAINMASTER_DATABASE_URL" not in seen and "UNDECLARED_SECRET" not in seen, sorted(seen)
    assert not [value for value in seen.values() if "hunter2" in value or "s3cret" in value]


def test_a_wrong_secret_is_refused_and_logged(setup: dict[str, str]) -> None:
    path = the_socket(setup)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(path))
        answer = ask(conn, ["x"], secret="not-the-secret", env={"TRAINMASTER_JOB_ID": "intruder"})
    assert answer == {"cold": "the warm server refused the job: wrong secret"}
    log = path.with_suffix(".log")
    wait_until(lambda: '"reason": "wrong secret"' in log.read_text(), 30, interval=0.1, what="the refusal logged")

    # A client whose secret file is stale starts its job cold and says why.
    secret = secret_path(path)
    kept = read_secret(secret)
    assert len(kept) == 64 and stat.S_IMODE(secret.stat().st_mode) == 0o600
    try:
        secret.write_text("stale")
        record = record_of(run(ray_job(setup, TRAINMASTER_JOB_ID="job-stale")))
    finally:
        secret.write_text(kept)
    assert record["start"] == {
        **record["start"],
        "warm": False,
        "reason": "the warm server refused the job: wrong secret",
    }
    assert record["job"] == "job-stale" and record_of(run(setup))["start"]["warm"] is True


def test_a_peer_of_another_uid_is_refused() -> None:
    """The peer check itself, on a connected pair of sockets (no root needed)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with mine, theirs:
        assert peer_refusal(mine, os.getuid()) is None
        refusal = peer_refusal(mine, os.getuid() + 1)
    assert (
        refusal == f"its process {os.getpid()} runs as uid {os.getuid()}, not the warm server's uid {os.getuid() + 1}"
    )


def answer_to_another_uid(path: Path, secret: str) -> Any:
    """What the server answers a process of OTHER_UID (forked from this one: the interpreter's folder
    may be closed to that uid) that connects to `path` and presents `secret`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        answer: Any
        try:
            os.chdir(path.parent)  # pytest's folders above it are root's own
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(path.name)
                try:
                    answer = ask(conn, ["x"], secret=secret, env={"TRAINMASTER_JOB_ID": "other-uid"})
                except OSError:  # refused before its request was read
                    answer = json.loads(conn.makefile().readline() or "null")
        except BaseException as exc:
            answer = {"error": repr(exc)}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as reader:
        answer = json.loads(reader.read())
    os.waitpid(pid, 0)
    return answer


@pytest.mark.skipif(os.getuid() != 0, reason="running a process as another uid needs root (CI runs as root)")
def test_a_process_of_another_uid_is_refused_even_where_the_folder_lets_it_in(setup: dict[str, str]) -> None:
    """A real process of uid 65534 that reaches the socket (its folder opened up by mistake) and even
    knows the secret is refused by the server's SO_PEERCRED check, and nothing is forked for it."""
    path = the_socket(setup)
    folder_mode, socket_mode = stat.S_IMODE(path.parent.stat().st_mode), stat.S_IMODE(path.stat().st_mode)
    try:
        path.parent.chmod(0o711)
        path.chmod(0o777)
        answer = answer_to_another_uid(path, read_secret(secret_path(path)))
    finally:
        path.parent.chmod(folder_mode)
        path.chmod(socket_mode)
    assert "cold" in answer, answer
    assert answer["cold"].startswith("the warm server refused the job: its process ")
    assert answer["cold"].endswith(f"runs as uid {OTHER_UID}, not the warm server's uid 0"), answer
    log = path.with_suffix(".log").read_text()
    assert f"runs as uid {OTHER_UID}" in log and '"event": "forked"' not in log.split(f"uid {OTHER_UID}")[1]


def test_a_socket_folder_of_another_owner_or_a_wider_mode_is_refused(tmp_path: Path) -> None:
    """By the client (the job starts cold, saying what to do) and by a server asked to listen there."""
    folder = tmp_path / "sockets"
    env = ray_job({**node_env(), "TRAINMASTER_WARM_DIR": str(folder), "JOB_CWD": str(tmp_path)}, TRAINMASTER_JOB_ID="j")
    env.update(TRAINMASTER_WARM_TARGET="warm_target:main", PYTHONPATH=str(tmp_path))
    (tmp_path / "warm_target.py").write_text(TARGET)

    folder.mkdir(mode=0o700)
    folder.chmod(0o755)
    start = record_of(run(env))["start"]
    assert start["warm"] is False
    assert start["reason"] == (
        f"no warm server: {folder} is not private to uid {os.getuid()} (a directory, owner {os.getuid()},"
        f" mode 755): remove it, or set TRAINMASTER_WARM_DIR to a directory of this user with mode 0700"
    )
    assert list(folder.iterdir()) == []  # no server was started there

    server = subprocess.run(
        [sys.executable, "-m", "workers.warm", "--serve", str(folder / "s.sock")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert server.returncode != 0 and "refusing to serve: " in server.stderr and "mode 755" in server.stderr
    assert not (folder / "s.sock").exists() and not (folder / "s.secret").exists()

    folder.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    folder.symlink_to(tmp_path / "elsewhere")
    assert "(a symlink, owner" in record_of(run(env))["start"]["reason"]

    if os.getuid() == 0:  # chown needs root
        folder.unlink()
        folder.mkdir(mode=0o700)
        os.chown(folder, OTHER_UID, OTHER_UID)
        assert f"(a directory, owner {OTHER_UID}, mode 700)" in record_of(run(env))["start"]["reason"]
