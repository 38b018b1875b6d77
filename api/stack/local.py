"""`trainmaster up | join | status | down`: the whole platform on one machine, with no configuration.

`up` starts, in the background: an embedded PostgreSQL (unless TRAINMASTER_DATABASE_URL is set)
migrated to head, a local Ray head with token auth, and a supervisor that runs the API and a
dispatcher and restarts them if they die. It writes the API address and a fresh token to
~/.trainmaster/config (TRAINMASTER_HOME), so the SDK and CLI work without flags.

Run by root, each local cluster's Ray processes run as an unprivileged OS user of their own
(api/stack/osusers.py), and checkpoints go to a folder outside root's home that every cluster user can
write its own projects' folders in but not list (/var/lib/trainmaster/<stack>/storage). Where those users
cannot run this Python, one cluster runs as root (`up` says so) and several are refused: they would share
one trust domain. Where each file and folder lives, and how it is made private: api/stack/folders.py.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from api.auth import admin
from api.stack import osusers, postgres, ray_head
from api.stack.folders import database_dir, home, home_folder, private_home, service_root, session_dir, stack_name
from api.stack.joined import join as join  # `trainmaster join`, beside the other verbs
from api.stack.joined import leave
from api.stack.osusers import OsUser
from api.stack.processes import alive, bin_path, kill_group, wait_for
from trainmaster import config as client_config
from trainmaster.ports import free_port


@dataclass
class StackState:
    home: str
    database_url: str
    embedded_postgres: bool
    ray_dashboard: str
    ray_gcs: str
    api_url: str
    ray_temp_dir: str = ""  # every process of the stack's Ray head names it on its command line
    worker_nodes: list[str] = field(default_factory=list)  # temp dirs of the extra local Ray nodes
    # The extra local clusters (`up --clusters N`): each a Ray head of its own, {name, dashboard, gcs,
    # temp_dir, token_file}, registered as a cluster record.
    clusters: list[dict[str, str]] = field(default_factory=list)
    storage_path: str = ""  # checkpoints; empty: <home>/storage
    # What the API and the dispatcher connect as: the embedded server's login of the least-privilege role
    # (migration 0022); empty: `database_url` (the owner's, which migrations and `trainmaster db` use).
    service_database_url: str = ""
    database_dir: str = ""  # the embedded PostgreSQL's data; empty: <home>/pgdata
    supervisor_pid: int | None = None
    components: dict[str, Any] = field(default_factory=dict)


def state_path() -> Path:
    return home() / "stack.json"


def load_state() -> StackState | None:
    try:
        return StackState(**json.loads(state_path().read_text()))
    except (OSError, ValueError, TypeError):
        return None


def save_state(state: StackState) -> None:
    """stack.json (mode 0600: it holds the database's URLs), replaced whole, never written through a link."""
    osusers.replace_private(state_path(), json.dumps(asdict(state), indent=2).encode())


def ray_token_path() -> Path:
    return home() / "ray_auth_token"


def secrets_dir() -> Path:
    """The platform's secrets folder (TRAINMASTER_SECRETS_PATH of the API and the dispatcher): the other
    clusters' Ray tokens, which their records name (api/clusters/token_source.py). Private: 0700."""
    folder = home() / "secrets"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def api_ready(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


UP_TOKEN = ("--scope", "admin", "--expires-in", "never", "--description", "trainmaster up")


def _who() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a container without a passwd entry)
        return "unknown"


def cluster_users(names: list[str], say: Any) -> dict[str, OsUser | None]:
    """The OS user each local cluster runs as (api/stack/osusers.py, made here): None unless `up` runs as
    root. Where those users cannot run this Python (installed under a folder only root may enter), one
    cluster runs as root, and `up` says so and what to change; several are refused before anything is
    made or started, since as one user they would be one trust domain."""
    if os.geteuid() != 0:
        return dict.fromkeys(names)
    why = next(filter(None, (osusers.cannot_run_python(osusers.user_name(name)) for name in names)), None)
    if why and len(names) > 1:
        raise RuntimeError(
            f"`up --clusters {len(names)}` runs each cluster as an OS user of its own, so that a job of one cannot "
            f"read another's processes, tokens or files, but {why}. Nothing was started"
        )
    if why:
        say(f"the cluster runs as {_who()}, not as a user of its own: {why}")
        return dict.fromkeys(names)
    return {name: osusers.cluster_user(name) for name in names}


def server_env(state: StackState) -> dict[str, str]:
    """The API's and the dispatcher's: the shell's settings, Ray's auth and the stack's own."""
    env = ray_head.with_ray_auth(dict(os.environ), ray_token_path())
    env.update(
        {
            "TRAINMASTER_DATABASE_URL": state.service_database_url or state.database_url,
            "TRAINMASTER_RAY_ADDRESS": state.ray_dashboard,
            "TRAINMASTER_API_URL": state.api_url,
            "TRAINMASTER_API_PORT": state.api_url.rsplit(":", 1)[1],
            "TRAINMASTER_STORAGE_PATH": state.storage_path or str(home() / "storage"),
            "TRAINMASTER_CODE_CACHE_PATH": str(home() / "code"),
            "TRAINMASTER_SECRETS_PATH": str(secrets_dir()),
        }
    )
    return env


# -- verbs --------------------------------------------------------------------------------------


def up(
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    api_port: int = 8000,
    nodes: int = 1,
    cpus_per_node: float = 1.0,
    node_resources: dict[str, float] | None = None,
    node_ip: str = "127.0.0.1",
    node_labels: list[dict[str, str]] | None = None,
    clusters: int = 1,
    cpus_per_cluster: int = 2,
    say: Any = print,
) -> tuple[StackState, bool]:
    """Start what is not running; returns (state, started_anything).

    `nodes` > 1 adds nodes - 1 Ray worker nodes on this machine, each its own raylet with
    `cpus_per_node` CPUs, a resource `tm_node_<i>: 1` naming it, and `node_resources`: multi-node
    behaviour (spread gangs, fragmentation, a lost node) on one laptop. `node_labels[i]` labels node
    i (the head is 0), e.g. racks for `scaling.topology`.

    `clusters` > 1 starts clusters - 1 more Ray heads (`cpus_per_cluster` CPUs each), each with its own
    token, ports and session folder, registered as the clusters `cluster-2`, `cluster-3`, …: the
    dispatcher serves them all, and a project bound to one runs there alone. Run by root, each runs as an
    OS user of its own (refused, before anything starts, where those users cannot run this Python); run
    by anyone else they are one OS user, one trust domain (`up` says so): separation needs root or
    machines of their own.
    """
    node_labels = node_labels or []
    if len(node_labels) > nodes:
        raise ValueError(f"{len(node_labels)} sets of node labels for {nodes} node(s): give at most one per node")
    users = cluster_users(["default", *(f"cluster-{i}" for i in range(2, clusters + 1))], say)
    root = private_home()
    existing = load_state()
    if existing is not None and all(component["healthy"] for component in status(existing).values()):
        return existing, False
    if existing is not None:
        down(say=lambda *_: None)
    home_folder("logs")

    storage = ""
    if any(users.values()):
        storage = str(osusers.shared_root(service_root() / "storage"))
    # Ray's nodes (seconds of `ray start` each) come up beside the database and its migrations.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ray-start") as pool:
        rays = pool.submit(
            lambda: _start_rays(
                root, users, nodes=nodes, num_cpus=num_cpus, num_gpus=num_gpus, cpus_per_node=cpus_per_node,
                node_resources=node_resources, node_ip=node_ip, node_labels=node_labels, clusters=clusters,
                cpus_per_cluster=cpus_per_cluster, say=say,
            )
        )  # fmt: skip
        database_url = os.environ.get("TRAINMASTER_DATABASE_URL")
        embedded = database_url is None
        data_dir: Path | None = None
        try:
            if database_url is None:
                say("starting embedded PostgreSQL")
                data_dir = database_dir()
                database_url = postgres.start_embedded(data_dir)
            say("migrating the database")
            env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url}
            migrate = [bin_path("trainmaster"), "db", "upgrade"]
            subprocess.run(migrate, env=env, check=True, capture_output=True, timeout=120)
        except BaseException:
            if rays.exception() is None:  # no stack without its database: stop the Ray nodes it started
                head, worker_dirs, extra = rays.result()
                _stop_rays(head.temp_dir, head.gcs_address, worker_dirs, extra, say)
            raise
        head, worker_dirs, extra = rays.result()
    if extra and all(users.values()):
        named = ", ".join(f"{name} as {user.name}" for name, user in users.items() if user)
        say(f"each cluster runs as an OS user of its own: {named}")
    elif extra:
        say(
            f"{len(extra) + 1} clusters on one machine run as one OS user ({_who()}): a job of one can read the "
            "other's files and processes, so they share one trust domain; run `up` as root for an OS user per "
            "cluster, or give each cluster machines of its own"
        )
    state = StackState(
        home=str(root),
        database_url=database_url,
        embedded_postgres=embedded,
        ray_dashboard=head.dashboard,
        ray_gcs=head.gcs_address,
        ray_temp_dir=str(head.temp_dir),
        worker_nodes=worker_dirs,
        clusters=extra,
        storage_path=storage,
        # A server the operator gave (TRAINMASTER_DATABASE_URL) is connected to as they said.
        service_database_url=postgres.service_login(database_url) if embedded else "",
        database_dir=str(data_dir or ""),
        api_url=f"http://127.0.0.1:{free_port(api_port)}",
    )

    # The cluster `default` (migration 0013) is this stack's Ray head; the others are added or moved.
    admin.point_cluster(database_url, "default", head.dashboard, str(ray_token_path()))
    for cluster in extra:
        admin.point_cluster(database_url, cluster["name"], cluster["dashboard"], cluster["token_file"])

    say("starting the API and the dispatcher")
    with osusers.append_private(root / "logs" / "supervisor.log") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "api.stack.supervisor", str(state_path())],
            env=server_env(state),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=0o077,  # the API's and the dispatcher's logs and files: this user's alone
        )
    state.supervisor_pid = supervisor.pid
    save_state(state)
    # The person who ran `up` owns the stack: an admin token (also the project `default`'s), never
    # expiring; made in the database while the API starts.
    create = [bin_path("trainmaster"), "token", "create", "--project", "default", "--user", _who(), *UP_TOKEN]
    minting = subprocess.Popen(create, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: api_ready(state.api_url), 60, "the API to be ready", supervisor, str(root / "logs"))
    token, errors = minting.communicate(timeout=60)
    if minting.returncode != 0:
        raise subprocess.CalledProcessError(minting.returncode, create, token, errors)
    client_config.save_file({"api_url": state.api_url, "token": token.strip()})
    return state, True


def _start_rays(
    root: Path,
    users: dict[str, OsUser | None],
    *,
    nodes: int,
    num_cpus: int | None,
    num_gpus: int | None,
    cpus_per_node: float,
    node_resources: dict[str, float] | None,
    node_ip: str,
    node_labels: list[dict[str, str]],
    clusters: int,
    cpus_per_cluster: int,
    say: Any,
) -> tuple[ray_head.RayHead, list[str], list[dict[str, str]]]:
    """`up`'s Ray: the head, its `nodes` - 1 worker nodes, and the heads of the other clusters; returns the
    head, the worker nodes' folders and the other clusters' records."""
    say("starting the Ray head (token auth on)" + (f", as {users['default'].name}" if users["default"] else ""))
    head = ray_head.start(
        session_dir(),
        ray_token_path(),
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        node_ip=node_ip,
        log_path=root / "logs" / "ray-start.log",
        labels=node_labels[0] if node_labels else None,
        user=users["default"],
    )
    worker_dirs = []
    for index in range(1, nodes):
        say(f"adding Ray worker node {index} of {nodes - 1}")
        folder = session_dir()
        ray_head.join(
            head.gcs_address,
            ray_token_path(),
            folder,
            num_cpus=cpus_per_node,
            num_gpus=0,
            resources={f"tm_node_{index}": 1.0, **(node_resources or {})},
            node_ip=node_ip,
            log_path=root / "logs" / "ray-start.log",
            labels=node_labels[index] if index < len(node_labels) else None,
            user=users["default"],
        )
        worker_dirs.append(str(folder))
    wait_for(lambda: len(_nodes(head)) >= nodes, 120, f"{nodes} Ray node(s) to register", where=str(root / "logs"))
    extra = []
    for index in range(2, clusters + 1):
        name = f"cluster-{index}"
        say(f"starting the Ray head of cluster {name} (its own token and session folder)")
        other = ray_head.start(
            session_dir(),
            secrets_dir() / f"ray_auth_token-{name}",
            num_cpus=cpus_per_cluster,
            num_gpus=0,
            node_ip=node_ip,
            log_path=root / "logs" / "ray-start.log",
            user=users[name],
        )
        extra.append(
            {
                "name": name,
                "dashboard": other.dashboard,
                "gcs": other.gcs_address,
                "temp_dir": str(other.temp_dir),
                "token_file": str(other.token_path),
            }
        )
    return head, worker_dirs, extra


def _stop_rays(temp_dir: Path, gcs: str, worker_dirs: list[str], clusters: list[dict[str, str]], say: Any) -> None:
    """Stop a stack's Ray: the head started with `temp_dir`, its worker nodes, the other clusters' heads."""
    for folder in worker_dirs:
        ray_head.stop(Path(folder))
    for cluster in clusters:
        say(f"stopping the Ray head of cluster {cluster['name']}")
        ray_head.stop(Path(cluster["temp_dir"]), cluster["gcs"])
    say("stopping the Ray head" + (f" and {len(worker_dirs)} worker node(s)" if worker_dirs else ""))
    ray_head.stop(temp_dir, gcs)


def status(state: StackState | None = None) -> dict[str, dict[str, Any]]:
    state = state or load_state()
    if state is None:
        return {}
    head = ray_head.RayHead(state.ray_dashboard, state.ray_gcs, ray_token_path(), Path(state.ray_temp_dir))
    used_total = head.cpus()
    cpus = used_total[1] if used_total else None
    node_count = len(_nodes(head)) if cpus is not None else 0
    components: dict[str, dict[str, Any]] = {
        "postgres": {
            "healthy": postgres.reachable(state.database_url),
            "detail": "embedded" if state.embedded_postgres else "external",
        },
        "ray": {
            "healthy": cpus is not None and node_count >= 1 + len(state.worker_nodes),
            "detail": f"{state.ray_dashboard}: {node_count} node(s), {cpus or 0:g} CPU",
        },
        "api": {"healthy": api_ready(state.api_url), "detail": state.api_url},
    }
    for cluster in state.clusters:
        other = ray_head.RayHead(
            cluster["dashboard"], cluster["gcs"], Path(cluster["token_file"]), Path(cluster["temp_dir"])
        )
        other_cpus = other.total_cpus()
        components[f"ray {cluster['name']}"] = {
            "healthy": other_cpus >= 0,
            "detail": f"{cluster['dashboard']}: {other_cpus:g} CPU"
            if other_cpus >= 0
            else f"{cluster['dashboard']}: down",
        }
    pids = _supervised_pids()
    components["dispatcher"] = {"healthy": alive(pids.get("dispatcher")), "detail": f"pid {pids.get('dispatcher')}"}
    components["supervisor"] = {"healthy": alive(state.supervisor_pid), "detail": f"pid {state.supervisor_pid}"}
    return components


def down(say: Any = print) -> bool:
    left = leave(say)
    state = load_state()
    if state is None:
        return left
    if state.supervisor_pid and alive(state.supervisor_pid):
        say("stopping the API and the dispatcher")
        kill_group(state.supervisor_pid)
    # A state written before session folders were made fresh names none: its head's folder had this name.
    head = Path(state.ray_temp_dir or f"/tmp/{stack_name()}")
    _stop_rays(head, state.ray_gcs, state.worker_nodes, state.clusters, say)
    if state.embedded_postgres:
        say("stopping embedded PostgreSQL")
        postgres.stop_embedded(Path(state.database_dir) if state.database_dir else home() / "pgdata")
    state_path().unlink(missing_ok=True)
    return True


def _supervised_pids() -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads((home() / "supervised.json").read_text()).items()}
    except (OSError, ValueError):
        return {}


def _nodes(head: ray_head.RayHead) -> list[Any]:
    from api.dispatcher.backend import RayUnavailable
    from api.dispatcher.ray_jobs import RayJobsBackend

    try:
        return RayJobsBackend(head.dashboard, token=head.token_path.read_text().strip(), timeout_s=5).cluster().nodes
    except (RayUnavailable, OSError):
        return []


# -- joining another machine's cluster ------------------------------------------------------------


def join_line(state: StackState) -> str:
    """What another machine runs to add itself to this stack's Ray cluster."""
    return f"trainmaster join {state.ray_gcs} --token-file {ray_token_path()}  (copy the token file there first)"
