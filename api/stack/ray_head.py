"""A Ray head with token auth on loopback, started and stopped without touching other Ray clusters.

Used by `trainmaster up` and by the test suite, so both run Ray the same way.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx

from api.stack import osusers
from api.stack.osusers import OsUser
from api.stack.processes import bin_path, kill_matching, wait_for
from trainmaster.ports import free_port

RAY_SIDE_PORTS = (
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--ray-client-server-port",
    "--node-manager-port",
    "--object-manager-port",
)


def ray_port_flags() -> list[str]:
    """Free ports for every fixed-port side process of a Ray node.

    Ray's defaults (52365 for the dashboard agent, 10001 for the client server, ...) collide when a
    second head runs on the machine, and the collision surfaces only later as "No available agent
    to submit job".
    """
    sockets = []
    for _ in RAY_SIDE_PORTS:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    flags = [f"{flag}={sock.getsockname()[1]}" for flag, sock in zip(RAY_SIDE_PORTS, sockets, strict=True)]
    for sock in sockets:
        sock.close()
    return flags


def ray_env(token_path: Path) -> dict[str, str]:
    """The environment of a Ray process started here: the shell's, less the platform's secrets (every
    job on a node can read its node's environment), with Ray's token auth."""
    return with_ray_auth({k: v for k, v in os.environ.items() if not platform_secret(k, v)}, token_path)


def with_ray_auth(env: dict[str, str], token_path: Path) -> dict[str, str]:
    """`env` with this stack's Ray token auth and no other cluster's address."""
    env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(name, None)
    return env


def platform_secret(name: str, value: str) -> bool:
    """A database URL or a token of the platform, which no Ray node may be given."""
    ours = name.startswith("TRAINMASTER_") and (name.endswith("DATABASE_URL") or "TOKEN" in name)
    return ours or "postgresql://" in value or "postgres://" in value


@dataclass
class RayHead:
    dashboard: str
    gcs_address: str
    token_path: Path
    temp_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return ray_env(self.token_path)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token_path.read_text().strip()}"}

    def ports(self) -> tuple[int, int]:
        return int(self.gcs_address.rsplit(":", 1)[1]), int(self.dashboard.rsplit(":", 1)[1])

    def cpus(self) -> tuple[float, float] | None:
        """(used, total) CPUs as the head reports them, or None while it does not answer."""
        try:
            body = httpx.get(f"{self.dashboard}/api/cluster_status", headers=self.headers(), timeout=5).json()
            used, total = body["data"]["clusterStatus"]["loadMetricsReport"]["usage"]["CPU"]
            return float(used), float(total)
        except (OSError, httpx.HTTPError, KeyError, TypeError, ValueError):
            return None

    def free_cpus(self) -> float:
        """CPUs free now; -1 while the head does not answer."""
        cpus = self.cpus()
        return cpus[1] - cpus[0] if cpus else -1.0

    def total_cpus(self) -> float:
        cpus = self.cpus()
        return cpus[1] if cpus else -1.0


def start(
    temp_dir: Path,
    token_path: Path,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    ports: tuple[int, int] | None = None,
    node_ip: str = "127.0.0.1",
    log_path: Path | None = None,
    ready_timeout_s: float = 120.0,
    labels: dict[str, str] | None = None,
    user: OsUser | None = None,
) -> RayHead:
    """`ray start --head` on 127.0.0.1; returns once the head reports its CPUs.

    `temp_dir` must be short: Ray keeps Unix sockets under it (107-byte limit). With the `ports`
    (GCS, dashboard) and token of a stopped head, that head comes back at the same address. Its
    processes run as `user` when given (api/stack/osusers.py; its parent folders must let it pass).
    """
    ensure_token(token_path)
    gcs_port, dashboard_port = ports or (free_port(6379), free_port(8265))
    command = [
        bin_path("ray"),
        "start",
        "--head",
        f"--port={gcs_port}",
        f"--dashboard-port={dashboard_port}",
        "--include-dashboard=true",
        "--disable-usage-stats",
        f"--temp-dir={session_root(temp_dir)}",
        f"--node-ip-address={node_ip}",  # loopback unless other machines are to join
        "--dashboard-host=127.0.0.1",  # never expose the dashboard, whatever the node address
        *ray_port_flags(),
    ]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    if labels:
        command.append(label_flag(labels))
    head = RayHead(f"http://127.0.0.1:{dashboard_port}", f"127.0.0.1:{gcs_port}", token_path, temp_dir)
    _run(command, node_env(token_path, temp_dir, user), log_path, "`ray start --head`", user)
    wanted = float(num_cpus) if num_cpus is not None else None

    def ready() -> bool:
        cpus = head.cpus()
        return cpus is not None and (wanted is None or cpus[1] == wanted)

    wait_for(ready, ready_timeout_s, "the Ray head to report its resources", where=str(log_path or temp_dir))
    return head


def ensure_token(token_path: Path) -> Path:
    """`token_path` holding a Ray token readable by its owner alone: a new random one (written as
    `osusers.write_private` does) when nothing is there; an existing file is made 0600 through a descriptor
    opened without following links, so a link there is refused rather than its target changed."""
    token_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(token_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return osusers.write_private(token_path, secrets.token_hex(32).encode())
    except OSError as exc:
        raise RuntimeError(f"cannot use the Ray token file {token_path}: {exc.strerror} (a link is refused)") from exc
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return token_path


def label_flag(labels: dict[str, str]) -> str:
    """`ray start --labels key1=val1,key2=val2`."""
    return "--labels=" + ",".join(f"{key}={value}" for key, value in labels.items())


def parse_labels(text: str) -> dict[str, str]:
    """`rack=r1,block=b2` -> {"rack": "r1", "block": "b2"}; ValueError naming what is wrong."""
    labels = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"a label is KEY=VALUE (e.g. rack=r1), not {pair!r}")
        labels[key.strip()] = value.strip()
    return labels


JOIN_TRIES = 3  # `ray start` of a worker node, when it timed out waiting for its raylet to register


def join(
    gcs_address: str,
    token_path: Path,
    temp_dir: Path,
    *,
    num_cpus: float | None = None,
    num_gpus: int | None = None,
    resources: dict[str, float] | None = None,
    node_ip: str | None = None,
    log_path: Path | None = None,
    labels: dict[str, str] | None = None,
    user: OsUser | None = None,
) -> list[str]:
    """Add a node to the cluster whose GCS is at `gcs_address` (this machine or another), with token
    auth and node `labels` (`rack=r1`: what a job's `scaling.topology` names). Several nodes may run
    on one machine, each with its own `temp_dir` (which is also how `stop` finds its processes), run as
    `user` when given (its cluster's: api/stack/osusers.py). Returns the `ray start` command, for people
    to repeat by hand."""
    command = [
        bin_path("ray"),
        "start",
        f"--address={gcs_address}",
        f"--temp-dir={session_root(temp_dir)}",
        "--disable-usage-stats",
        *ray_port_flags(),
    ]
    if node_ip:
        command.append(f"--node-ip-address={node_ip}")
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus:g}")
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    if resources:
        command.append(f"--resources={json.dumps(resources)}")
    if labels:
        command.append(label_flag(labels))
    what = f"`ray start --address={gcs_address}`"
    tries = 1
    while True:
        try:
            _run(command, node_env(token_path, temp_dir, user), log_path, what, user)
            return command
        except RuntimeError as exc:
            # Ray waits a fixed 30 s for a new raylet to register; a loaded machine or GCS can take
            # longer. Its half-started processes are stopped (by their temp dir) before it is tried again.
            if "timed out during startup" not in str(exc) or tries == JOIN_TRIES:
                raise
        stop(temp_dir)
        tries += 1


def session_root(temp_dir: Path) -> Path:
    """Ray's own temp dir, inside `temp_dir`: Ray makes its temp dir world-writable (mode 0777, for
    users sharing /tmp/ray), so the folder it sits in is the one kept private (`node_env`)."""
    return temp_dir / "ray"


def node_env(token_path: Path, temp_dir: Path, user: OsUser | None) -> dict[str, str]:
    """The environment of a Ray node's processes, whose session folder `temp_dir` is made private to
    them (`osusers.private_dir`: made here, or a fresh one from `folders.session_dir`): as `user`, their
    home is that folder and they read their own copy of the token, written where nothing was."""
    osusers.private_dir(temp_dir, user)
    if user is None:
        return ray_env(token_path)
    own = osusers.own_copy(token_path, temp_dir, user)
    return {**ray_env(own), "HOME": str(temp_dir), "USER": user.name, "LOGNAME": user.name}


def _run(command: list[str], env: dict[str, str], log_path: Path | None, what: str, user: OsUser | None) -> None:
    # umask 077: what Ray and every job on the node write (logs, checkpoints) is its uid's alone.
    uid, gid = (user.uid, user.gid) if user else (None, None)
    groups: list[int] | None = [] if user else None
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=180, umask=0o077, user=uid, group=gid,
        extra_groups=groups,
    )  # fmt: skip
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with osusers.append_private(log_path) as log:
            log.write((result.stdout + result.stderr).encode())
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{what} failed: " + " | ".join(tail))


def stop(temp_dir: Path, gcs_address: str | None = None, timeout: float = 5.0) -> None:
    """Stop the processes of the Ray head started with `temp_dir`, and nothing else.

    `ray stop` would stop every Ray cluster of this user on the machine. The processes of one head
    are those whose command line names its temp dir or GCS address, and their descendants.
    """
    markers = [re.escape(str(temp_dir))]
    if gcs_address:  # e.g. Ray's client server, started with --address=<node ip>:<gcs port>
        markers.append(r"--address=[^\x00]*:" + re.escape(gcs_address.rsplit(":", 1)[1]) + r"(\x00|$)")
    kill_matching(markers, timeout)
    shutil.rmtree(temp_dir, ignore_errors=True)
