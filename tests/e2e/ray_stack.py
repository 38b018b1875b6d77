"""A real Ray head with token auth, and the trainmaster API and dispatcher as processes beside it."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from api.stack import ray_head
from api.stack.osusers import OsUser
from api.stack.ray_head import RayHead
from tests.e2e.conftest import REPO, TRAINMASTER, stop, wait_until


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
    # In the secrets folder the stack's API and dispatcher read cluster tokens from (api/clusters/token_source.py),
    # so a test registers this head as a cluster by its `token_path`.
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
    """Ray nodes start one at a time on this machine, whichever pytest-xdist worker starts them: the
    free ports a node picks stay free until it has bound them (a head prefers 6379 and 8265)."""
    with open(Path(tempfile.gettempdir()) / "trainmaster-tests-ray-start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def stop_ray_head(head: RayHead) -> None:
    """Stops this head only (`ray stop` would take every Ray cluster on the machine with it)."""
    ray_head.stop(head.temp_dir, head.gcs_address)
    shutil.rmtree(head.temp_dir.parent, ignore_errors=True)
    head.token_path.unlink(missing_ok=True)


@functools.cache
def secrets_path() -> Path:
    """This test process's secrets folder (TRAINMASTER_SECRETS_PATH of the stacks it starts): 0700, fresh."""
    return Path(tempfile.mkdtemp(prefix="tm-secrets-", dir="/tmp"))


@dataclass
class Dispatchers:
    env: dict[str, str]
    log_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"dispatcher-{name}.log").open("ab")
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


@dataclass
class MultiNode:
    """A Ray head and worker nodes on this machine, each its own raylet (as `trainmaster up --nodes`)."""

    head: RayHead
    nodes: list[Path] = field(default_factory=list)  # temp dirs of the worker nodes

    def add_node(self, num_cpus: float, resources: dict[str, float], labels: dict[str, str] | None = None) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="tmn-", dir="/tmp"))
        before = len(self.node_ids())
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
        wait_until(lambda: len(self.node_ids()) > before, 60, interval=0.5, what="the new node to register")
        self.nodes.append(folder)
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

    def kill_raylet(self, folder: Path) -> None:
        """SIGKILL the node's raylet, as a machine that dies would leave it."""
        import os
        import re
        import signal

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
        if folder in self.nodes:
            self.nodes.remove(folder)

    def stop(self) -> None:
        for folder in list(self.nodes):
            self.stop_node(folder)
        stop_ray_head(self.head)
