"""`trainmaster join` and the `down` that undoes it: this machine as a Ray worker node of another
machine's cluster, with the cluster's token in the stack's home (0600) and a fresh session folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from api.stack import osusers, ray_head
from api.stack.folders import home, home_folder, private_home, session_dir


def node_state_path() -> Path:
    return home() / "node.json"


def join(
    gcs_address: str,
    token: str,
    *,
    num_cpus: float | None = None,
    num_gpus: int | None = None,
    resources: dict[str, float] | None = None,
    node_ip: str | None = None,
    labels: dict[str, str] | None = None,
) -> list[str]:
    """Add this machine to a cluster as a Ray worker node; `trainmaster down` takes it out again."""
    root = private_home()
    token_path = osusers.replace_private(root / "ray_auth_token", token.strip().encode())
    logs = home_folder("logs")
    folder = session_dir()
    command = ray_head.join(
        gcs_address,
        token_path,
        folder,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        resources=resources,
        node_ip=node_ip,
        log_path=logs / "ray-join.log",
        labels=labels,
    )
    node = {"gcs_address": gcs_address, "temp_dir": str(folder)}
    osusers.replace_private(node_state_path(), json.dumps(node).encode())
    return command


def leave(say: Any = print) -> bool:
    try:
        node = json.loads(node_state_path().read_text())
    except (OSError, ValueError):
        return False
    say(f"leaving the Ray cluster at {node['gcs_address']}")
    ray_head.stop(Path(node["temp_dir"]))
    node_state_path().unlink(missing_ok=True)
    return True
