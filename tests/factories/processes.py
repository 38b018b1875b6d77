"""Real processes, started one way for the end-to-end tests and for bench/: `trainmaster api` on a
database, dispatchers, Ray heads and worker nodes (the code `trainmaster up` runs), and how to stop them.

bench/ imports this module too (its scripts run with the repository on `sys.path`), so a benchmark
measures the same API and Ray head the tests start. It imports no pytest.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from api.stack import ray_head
from api.stack.osusers import OsUser
from api.stack.ray_head import RayHead
from tests.factories.auth import project_token
from tests.factories.waiting import wait_until as wait_until  # bench/ imports it from here
from trainmaster.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TRAINMASTER = str(Path(sys.executable).with_name("trainmaster"))


def stop(process: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """SIGTERM, and SIGKILL after `grace_s`; to the whole process group when the process leads one (the
    API's uvicorn workers are in its group, and one left behind would keep its port and database)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        leads = os.getpgid(process.pid) == process.pid
        send = functools.partial(os.killpg, process.pid) if leads else process.send_signal
        send(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            process.wait()


def json_log_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """A process's output, each line with what it parses to: a JSON object with an event and a level,
    whose event is a name (not text) where the platform's own loggers wrote it."""
    lines = []
    for raw in path.read_text().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            raise AssertionError(f"{path.name}: a line that is not JSON: {raw[:300]}") from None
        assert isinstance(line, dict) and line.get("event") and line.get("level"), f"{path.name}: {raw[:300]}"
        if line.get("logger", "").startswith("trainmaster"):
            assert re.fullmatch(r"[a-z][a-z0-9_]*", line["event"]), f"{path.name}: not an event name: {raw[:300]}"
        lines.append((raw, line))
    return lines


@dataclass
class ApiProcess:
    url: str
    token: str  # of the project start_api was given
    env: dict[str, str]  # for a client process: the API's URL and this token
    process: subprocess.Popen[bytes]
    log_path: Path


def wait_answering(
    process: subprocess.Popen[Any], url: str, log_path: Path, timeout: float, what: str, interval: float = 0.2
) -> None:
    """Poll `url` until it answers 200; fail at once, with the end of `log_path`, if `process` exits."""

    def answering() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited: {log_path.read_text()[-2000:]}")
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(answering, timeout, interval=interval, what=f"{what} to answer {url}")


def start_api(
    database_url: str,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    port: int | None = None,
    ready_s: float = 30,
    *,
    workers: int | None = None,
    project: str = "e2e",
) -> ApiProcess:
    """`trainmaster api` on loopback (a free port unless `port`), in its own process group, ready; with a
    token of `project`. `workers` None: the API's own default."""
    port = port or free_port()
    env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url, **(extra_env or {})}
    command = [TRAINMASTER, "api", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", str(workers)] if workers is not None else []
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(process, f"{url}/readyz", log_path, ready_s, "trainmaster api")
    except BaseException:
        stop(process)
        raise
    token = project_token(database_url, project)
    client_env = {**env, "TRAINMASTER_API_URL": url, "TRAINMASTER_TOKEN": token}
    return ApiProcess(url=url, token=token, env=client_env, process=process, log_path=log_path)


@dataclass
class Dispatchers:
    env: dict[str, str]
    log_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with (self.log_dir / f"dispatcher-{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [TRAINMASTER, "dispatcher"],
                env={**self.env, "TRAINMASTER_DISPATCHER_ID": name, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            stop(process)
        self.processes.clear()


# -- Ray ----------------------------------------------------------------------------------------------


def start_ray_head(
    num_cpus: int = 4,
    num_gpus: int = 0,
    *,
    ports: tuple[int, int] | None = None,
    token: str | None = None,
    labels: dict[str, str] | None = None,
    user: OsUser | None = None,
) -> RayHead:
    """A new head (the same code `trainmaster up` runs), as `user` if given. With the `ports` (GCS,
    dashboard) and `token` of a stopped head: that head restarted, a fresh cluster at the same address."""
    # A short folder: Ray puts Unix sockets under it and their paths are limited to 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="tmray-", dir="/tmp"))
    if user is not None:
        folder.chmod(0o711)  # the user enters it to reach its own session folder; it lists nothing here
    # In the secrets folder the API and dispatchers started beside it read cluster tokens from
    # (api/clusters/token_source.py), so a test registers this head as a cluster by its `token_path`.
    token_path = secrets_path() / f"{folder.name}.token"
    token_path.write_text(token or secrets.token_hex(32))
    with one_start_at_a_time():
        return ray_head.start(
            folder / "ray",
            token_path,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            ports=ports,
            log_path=folder / "start.log",
            labels=labels,
            user=user,
        )


@contextlib.contextmanager
def one_start_at_a_time() -> Iterator[None]:
    """Ray nodes start one at a time on this machine, whichever process starts them: the free ports a
    node picks stay free until it has bound them (a head prefers 6379 and 8265)."""
    with open(Path(tempfile.gettempdir()) / "trainmaster-tests-ray-start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def stop_ray_head(head: RayHead) -> None:
    """Stops this head only (`ray stop` would take every Ray cluster on the machine with it)."""
    ray_head.stop(head.temp_dir, head.gcs_address)
    shutil.rmtree(head.temp_dir.parent, ignore_errors=True)
    head.token_path.unlink(missing_ok=True)


@contextlib.contextmanager
def running_ray_head(num_cpus: int) -> Iterator[RayHead]:
    head = start_ray_head(num_cpus)
    try:
        yield head
    finally:
        stop_ray_head(head)


@functools.cache
def secrets_path() -> Path:
    """This process's secrets folder (TRAINMASTER_SECRETS_PATH of the stacks it starts): 0700, fresh."""
    return Path(tempfile.mkdtemp(prefix="tm-secrets-", dir="/tmp"))


@dataclass
class MultiNode:
    """A Ray head and worker nodes on this machine, each its own raylet (as `trainmaster up --nodes`)."""

    head: RayHead
    nodes: dict[Path, str] = field(default_factory=dict)  # temp dir of each worker node -> its Ray node id

    def add_node(self, num_cpus: float, resources: dict[str, float], labels: dict[str, str] | None = None) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="tmn-", dir="/tmp"))
        before = set(self.node_ids())
        with one_start_at_a_time():
            ray_head.join(
                self.head.gcs_address,
                self.head.token_path,
                folder / "ray",
                num_cpus=num_cpus,
                num_gpus=0,
                resources=resources,
                log_path=folder / "join.log",
                labels=labels,
            )
        new = wait_until(lambda: set(self.node_ids()) - before, 60, interval=0.5, what="the new node to register")
        self.nodes[folder] = new.pop()
        return folder

    def node_ids(self, **labels: str) -> list[str]:
        """The alive nodes (those carrying every one of `labels`), as the dispatcher reads them."""
        from api.dispatcher.backend import RayUnavailable
        from api.dispatcher.ray_jobs import RayJobsBackend

        try:
            backend = RayJobsBackend(self.head.dashboard, token=self.head.token_path.read_text().strip())
            nodes = backend.cluster().nodes
        except RayUnavailable:
            return []
        return [node.node_id for node in nodes if labels.items() <= node.labels.items()]

    def folder_of(self, node_id: str) -> Path:
        return next(folder for folder, node in self.nodes.items() if node == node_id)

    def kill_raylet(self, folder: Path) -> None:
        """SIGKILL the node's raylet, as a machine that dies would leave it."""
        from api.stack.processes import matching

        raylets = [
            pid
            for pid in matching([re.escape(str(folder))])
            if "raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[0]
        ]
        assert raylets, f"no raylet under {folder}"
        for pid in raylets:
            os.kill(pid, signal.SIGKILL)

    def stop_node(self, folder: Path) -> None:
        ray_head.stop(folder / "ray")
        shutil.rmtree(folder, ignore_errors=True)
        self.nodes.pop(folder, None)

    def stop_nodes(self) -> None:
        for folder in list(self.nodes):
            self.stop_node(folder)

    def stop(self) -> None:
        self.stop_nodes()
        stop_ray_head(self.head)


def run_cli(*args: str, env: dict[str, Any], timeout: float = 120) -> str:
    """Run the `trainmaster` console script; its stdout, or an error with its output."""
    done = subprocess.run([TRAINMASTER, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"trainmaster {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout
