"""`trainmaster up | status | down`: the whole platform on one machine, with no configuration.

`up` starts, in the background: an embedded PostgreSQL (unless TRAINMASTER_DATABASE_URL is set)
migrated to head, a local Ray head with token auth, and a supervisor that runs the API and a
dispatcher and restarts them if they die. It writes the API address and a fresh token to
~/.trainmaster/config (TRAINMASTER_HOME), so the SDK and CLI work without flags.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from api.stack import postgres, ray_head
from api.stack.processes import alive, bin_path, free_port, kill_group, wait_for
from trainmaster import config as client_config


@dataclass
class StackState:
    home: str
    database_url: str
    embedded_postgres: bool
    ray_dashboard: str
    ray_gcs: str
    api_url: str
    ray_temp_dir: str = ""  # every process of the stack's Ray head names it on its command line
    supervisor_pid: int | None = None
    components: dict[str, Any] = field(default_factory=dict)


def home() -> Path:
    return client_config.home()


def state_path() -> Path:
    return home() / "stack.json"


def load_state() -> StackState | None:
    try:
        return StackState(**json.loads(state_path().read_text()))
    except (OSError, ValueError, TypeError):
        return None


def save_state(state: StackState) -> None:
    state_path().parent.mkdir(parents=True, exist_ok=True)
    state_path().write_text(json.dumps(asdict(state), indent=2))


def ray_temp_dir() -> Path:
    # Ray keeps Unix sockets under its temp dir; their paths must stay under 107 bytes.
    digest = hashlib.sha256(str(home()).encode()).hexdigest()[:8]
    return Path("/tmp") / f"tm-ray-{digest}"


def ray_token_path() -> Path:
    return home() / "ray_auth_token"


def api_ready(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def server_env(state: StackState) -> dict[str, str]:
    env = ray_head.ray_env(ray_token_path())
    env.update(
        {
            "TRAINMASTER_DATABASE_URL": state.database_url,
            "TRAINMASTER_RAY_ADDRESS": state.ray_dashboard,
            "TRAINMASTER_API_URL": state.api_url,
            "TRAINMASTER_API_PORT": state.api_url.rsplit(":", 1)[1],
            "TRAINMASTER_STORAGE_PATH": str(home() / "storage"),
            "TRAINMASTER_CODE_CACHE_PATH": str(home() / "code"),
        }
    )
    return env


# -- verbs --------------------------------------------------------------------------------------


def up(
    *, num_cpus: int | None = None, num_gpus: int | None = None, api_port: int = 8000, say: Any = print
) -> tuple[StackState, bool]:
    """Start what is not running; returns (state, started_anything)."""
    existing = load_state()
    if existing is not None and all(component["healthy"] for component in status(existing).values()):
        return existing, False
    if existing is not None:
        down(say=lambda *_: None)
    root = home()
    (root / "logs").mkdir(parents=True, exist_ok=True)

    database_url = os.environ.get("TRAINMASTER_DATABASE_URL")
    embedded = database_url is None
    if database_url is None:
        say("starting embedded PostgreSQL")
        database_url = postgres.start_embedded(root / "pgdata")
    say("migrating the database")
    env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url}
    subprocess.run([bin_path("trainmaster"), "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)

    say("starting the Ray head (token auth on)")
    head = ray_head.start(
        ray_temp_dir(), ray_token_path(), num_cpus=num_cpus, num_gpus=num_gpus, log_path=root / "logs" / "ray-start.log"
    )
    state = StackState(
        home=str(root),
        database_url=database_url,
        embedded_postgres=embedded,
        ray_dashboard=head.dashboard,
        ray_gcs=head.gcs_address,
        ray_temp_dir=str(head.temp_dir),
        api_url=f"http://127.0.0.1:{free_port(api_port)}",
    )

    say("starting the API and the dispatcher")
    with (root / "logs" / "supervisor.log").open("ab") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "api.stack.supervisor", str(state_path())],
            env=server_env(state),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    state.supervisor_pid = supervisor.pid
    save_state(state)
    wait_for(lambda: api_ready(state.api_url), 60, "the API to be ready", supervisor, str(root / "logs"))

    token = subprocess.run(
        [bin_path("trainmaster"), "token", "create", "--project", "default", "--description", "trainmaster up"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    client_config.save_file({"api_url": state.api_url, "token": token})
    return state, True


def status(state: StackState | None = None) -> dict[str, dict[str, Any]]:
    state = state or load_state()
    if state is None:
        return {}
    head = ray_head.RayHead(state.ray_dashboard, state.ray_gcs, ray_token_path(), ray_temp_dir())
    used_total = head.cpus()
    cpus = used_total[1] if used_total else None
    components: dict[str, dict[str, Any]] = {
        "postgres": {
            "healthy": postgres.reachable(state.database_url),
            "detail": "embedded" if state.embedded_postgres else "external",
        },
        "ray": {"healthy": cpus is not None, "detail": f"{state.ray_dashboard} ({cpus or 0:g} CPU)"},
        "api": {"healthy": api_ready(state.api_url), "detail": state.api_url},
    }
    pids = _supervised_pids()
    components["dispatcher"] = {"healthy": alive(pids.get("dispatcher")), "detail": f"pid {pids.get('dispatcher')}"}
    components["supervisor"] = {"healthy": alive(state.supervisor_pid), "detail": f"pid {state.supervisor_pid}"}
    return components


def down(say: Any = print) -> bool:
    state = load_state()
    if state is None:
        return False
    if state.supervisor_pid and alive(state.supervisor_pid):
        say("stopping the API and the dispatcher")
        kill_group(state.supervisor_pid)
    say("stopping the Ray head")
    ray_head.stop(Path(state.ray_temp_dir) if state.ray_temp_dir else ray_temp_dir(), state.ray_gcs)
    if state.embedded_postgres:
        say("stopping embedded PostgreSQL")
        postgres.stop_embedded(home() / "pgdata")
    state_path().unlink(missing_ok=True)
    return True


def _supervised_pids() -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads((home() / "supervised.json").read_text()).items()}
    except (OSError, ValueError):
        return {}
