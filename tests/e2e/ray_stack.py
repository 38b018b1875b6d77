"""A real Ray head with token auth, and the trainmaster API and dispatcher as processes beside it."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from api.stack import ray_head
from api.stack.ray_head import RayHead
from tests.e2e.conftest import REPO, TRAINMASTER, stop


def start_ray_head(
    num_cpus: int = 4, num_gpus: int = 0, *, ports: tuple[int, int] | None = None, token: str | None = None
) -> RayHead:
    """A new head (the same code `trainmaster up` runs). With the `ports` (GCS, dashboard) and `token`
    of a stopped head: that head restarted, a fresh cluster at the same address."""
    # A short folder: Ray puts Unix sockets under it and their paths are limited to 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="tmray-", dir="/tmp"))
    token_path = folder / "auth_token"
    token_path.write_text(token or secrets.token_hex(32))
    return ray_head.start(
        folder / "ray", token_path, num_cpus=num_cpus, num_gpus=num_gpus, ports=ports, log_path=folder / "start.log"
    )


def stop_ray_head(head: RayHead) -> None:
    """Stops this head only (`ray stop` would take every Ray cluster on the machine with it)."""
    ray_head.stop(head.temp_dir, head.gcs_address)
    shutil.rmtree(head.temp_dir.parent, ignore_errors=True)


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
