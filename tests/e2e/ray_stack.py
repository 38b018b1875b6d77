"""A real Ray head with token auth, and the trainmaster API and dispatcher as processes beside it."""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.e2e.conftest import REPO, TRAINMASTER, free_port, stop, wait_until
from trainmaster.stack import ray_port_flags

RAY = str(Path(TRAINMASTER).with_name("ray"))


@dataclass
class RayHead:
    dashboard: str
    gcs_address: str
    env: dict[str, str]
    num_cpus: int
    folder: Path

    def free_cpus(self) -> float:
        report = httpx.get(f"{self.dashboard}/api/cluster_status", headers=self.headers(), timeout=10).json()
        used, total = report["data"]["clusterStatus"]["loadMetricsReport"]["usage"]["CPU"]
        return float(total) - float(used)

    def ports(self) -> tuple[int, int]:
        return int(self.gcs_address.rsplit(":", 1)[1]), int(self.dashboard.rsplit(":", 1)[1])

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {Path(self.env['RAY_AUTH_TOKEN_PATH']).read_text().strip()}"}


def start_ray_head(
    num_cpus: int = 4, num_gpus: int = 0, *, ports: tuple[int, int] | None = None, token: str | None = None
) -> RayHead:
    """A new head. With the `ports` (GCS, dashboard) and `token` of a stopped head: that head restarted,
    a fresh cluster at the same address."""
    # A short folder: Ray puts Unix sockets under it and their paths are limited to 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="tmray-", dir="/tmp"))
    token_path = folder / "auth_token"
    token_path.write_text(token or secrets.token_hex(32))
    token_path.chmod(0o600)
    port, dashboard_port = ports or (free_port(), free_port())
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(name, None)
    subprocess.run(
        [
            RAY,
            "start",
            "--head",
            f"--num-cpus={num_cpus}",
            f"--num-gpus={num_gpus}",
            f"--port={port}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            "--include-dashboard=true",
            "--disable-usage-stats",
            f"--temp-dir={folder / 'ray'}",
            *ray_port_flags(),
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    head = RayHead(f"http://127.0.0.1:{dashboard_port}", f"127.0.0.1:{port}", env, num_cpus, folder)

    def ready() -> bool:
        try:
            return head.free_cpus() == num_cpus
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            return False

    wait_until(ready, 90, interval=0.5, what="the Ray head's resources to show")
    return head


def stop_ray_head(head: RayHead) -> None:
    """Stops this head only (`ray stop` would take every Ray cluster on the machine with it)."""
    from trainmaster.stack import stop_ray_head as stop_processes_under

    stop_processes_under(head.folder, head.gcs_address)


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
