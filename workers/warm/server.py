"""The warm driver's server: imports Ray Train once, then forks a child for each job it can serve,
which becomes that job's driver (run_child) with the job's environment, directory, arguments and output.
It serves only its own user's processes that present its secret (see workers/warm/__init__.py)."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster import json_logs
from workers.warm import (
    ENV_START,
    HEADER,
    PEERCRED,
    SINGLE_THREADED,
    entries,
    import_time,
    private_dir_problem,
    secret_path,
    target,
)

log = logging.getLogger("trainmaster.warm")

ENV_IDLE_S = "TRAINMASTER_WARM_IDLE_S"
DEFAULT_IDLE_S = 1800.0
# What the server imports before it serves: everything the driver needs to build a trainer.
PRELOAD = (
    "ray",
    "ray.train",
    "ray.train.v2.api.data_parallel_trainer",
    "workers.callbacks",
    "workers.lean_torch",
    "workers.frameworks.torch",
)
CLUSTER_CHECK_S = 5.0  # how often an idle server checks that its Ray cluster is still there


@dataclass
class Job:
    """A job handed to the server: what the forked child runs."""

    conn: socket.socket
    fds: list[int]
    request: dict[str, Any]
    server_env: dict[str, str]
    added_env: dict[str, str]  # what the server's imports set in its environment (a cold driver's would too)


@dataclass(frozen=True)
class Serving:
    """What the server checks each request against."""

    secret: str
    server_env: dict[str, str]
    added_env: dict[str, str]
    imported: Mapping[str, str | None]


def code_paths(server: Mapping[str, str], job: Mapping[str, str], cwd: str) -> list[str]:
    """The job's own sys.path entries: its working directory (`python -m` puts it first) and the
    PYTHONPATH entries the server lacks (Ray adds the job's working_dir there)."""
    shared = set(entries(server))
    return [cwd, *(entry for entry in entries(job) if entry not in shared and entry != cwd)]


def cold_reason(
    server: Mapping[str, str], job: Mapping[str, str], cwd: str, imported: Mapping[str, str | None]
) -> str | None:
    """Why a job cannot run in a child of this server (None: it can). `job`: the variables the job
    declared (the client sends no others; the rest of the child's environment is the server's, and
    the socket's name already differs for a client whose other import-time variables differ).
    `imported`: the server's top-level modules and their files."""
    for name in sorted(job):
        if import_time(name) and server.get(name) != job.get(name):
            return f"its {name} differs from the warm server's"
    own = code_paths(server, job, cwd)
    if [entry for entry in entries(job) if entry not in own] != entries(server):
        return "its PYTHONPATH differs from the warm server's"
    for folder in own:
        try:
            listed = list(os.scandir(folder))
        except OSError:
            continue
        for entry in sorted(listed, key=lambda e: e.name):
            module, file = _module_of(entry)
            if module is not None and module in imported and not _same_file(file, imported[module]):
                return f"its code has a module named {module!r}, which the warm server has imported from elsewhere"
    return None


def _module_of(entry: os.DirEntry[str]) -> tuple[str | None, str | None]:
    """The top-level module a folder entry would be imported as, ahead of one further down sys.path,
    and its file: a module file or a regular package (a folder without __init__.py shadows nothing)."""
    if entry.is_dir():
        init = os.path.join(entry.path, "__init__.py")
        return (entry.name, init) if os.path.exists(init) else (None, None)
    stem, dot, suffix = entry.name.partition(".")
    return (stem, entry.path) if dot and (suffix == "py" or suffix.endswith(("so", "pyc"))) else (None, None)


def _same_file(a: str | None, b: str | None) -> bool:
    try:
        return a is not None and b is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _top_level_modules() -> dict[str, str | None]:
    return {name: getattr(module, "__file__", None) for name, module in sys.modules.items() if "." not in name}


def serve(path: Path, idle_s: float) -> Job | None:
    """Accept jobs until idle for `idle_s`; in each forked child, return that child's job."""
    log.info("starting", extra={"path": str(path), "pid": os.getpid()})  # its pid: what stops it
    # What jobs are compared against: the environment the imports below read (`import ray` adds some).
    server_environ = {name: value for name, value in os.environ.items() if name not in SINGLE_THREADED}
    try:
        unsafe = private_dir_problem(path.parent)
        if unsafe is not None:
            log.error("unsafe_dir", extra={"error": unsafe})
            raise SystemExit(f"refusing to serve: {unsafe}")
        for name in (*PRELOAD, target().partition(":")[0]):
            __import__(name)
        secret = _write_secret(secret_path(path))
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(64)
    finally:
        path.with_suffix(".starting").unlink(missing_ok=True)
    added = {name: value for name, value in os.environ.items() if name not in server_environ}  # by imports
    serving = Serving(secret, server_environ, added, _top_level_modules())
    log.info("listening", extra={"path": str(path), "target": target(), "modules": len(sys.modules)})
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the client's connection)
    pid = os.getpid()
    idle_since = time.monotonic()
    try:
        while children or time.monotonic() - idle_since < idle_s:
            if not children and not _cluster_up(server_environ.get("RAY_ADDRESS")):
                break
            for key, _ in selector.select(timeout=min(CLUSTER_CHECK_S, idle_s)):
                if key.fileobj is listener:
                    job = _accept(listener, serving)
                    if job is None:
                        continue
                    child = os.fork()
                    if child == 0:
                        for fd, (_, other) in children.items():
                            os.close(fd)
                            other.close()
                        selector.close()
                        listener.close()
                        return job
                    for fd in job.fds:
                        os.close(fd)
                    pidfd = os.pidfd_open(child)
                    children[pidfd] = (child, job.conn)
                    selector.register(pidfd, selectors.EVENT_READ)
                    _send(job.conn, {"pid": child})
                    log.info("forked", extra={"child_pid": child, "job_id": _job_id(job)})
                else:
                    pidfd = int(key.fd)
                    selector.unregister(pidfd)
                    child, conn = children.pop(pidfd)
                    os.close(pidfd)
                    _, status = os.waitpid(child, 0)
                    code = os.waitstatus_to_exitcode(status)
                    _send(conn, {"exit": code})
                    conn.close()
                    log.info("exited", extra={"child_pid": child, "code": code})
                    idle_since = time.monotonic()
    finally:
        if os.getpid() == pid:  # not in a child on its way out of this function
            path.unlink(missing_ok=True)
            secret_path(path).unlink(missing_ok=True)
    path.with_suffix(".log").unlink(missing_ok=True)  # a clean exit: nothing to read
    return None


def _cluster_up(address: str | None) -> bool:
    """Whether the GCS this server's jobs connect to still accepts connections (True without one)."""
    host, _, port = (address or "").rpartition(":")
    if not host or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return False
    return True


def _write_secret(path: Path) -> str:
    """A fresh secret in a file only this user can read, in place before the socket exists."""
    secret = secrets.token_hex(32)
    staged = path.with_name(f"{path.name}.{os.getpid()}")
    fd = os.open(staged, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret.encode())
    finally:
        os.close(fd)
    os.replace(staged, path)
    return secret


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end of `conn`, as the kernel recorded them at connect."""
    pid, uid, _ = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    return pid, uid


def peer_refusal(conn: socket.socket, uid: int) -> str | None:
    """Why the process at the other end of `conn` may not hand this server a job (None: it may)."""
    peer_pid, peer_uid = peer_credentials(conn)
    if peer_uid != uid:
        return f"its process {peer_pid} runs as uid {peer_uid}, not the warm server's uid {uid}"
    return None


def _refuse(conn: socket.socket, reason: str, fds: list[int] | tuple[int, ...] = ()) -> None:
    log.warning("refused", extra={"reason": reason, "peer_pid": peer_credentials(conn)[0]})
    _send(conn, {"cold": f"the warm server refused the job: {reason}"})
    for fd in fds:
        os.close(fd)
    conn.close()


def _accept(listener: socket.socket, serving: Serving) -> Job | None:
    """A job's request and output; None when it goes cold (the client was told why), was refused or
    was malformed."""
    conn, _ = listener.accept()
    refusal = peer_refusal(conn, os.getuid())
    if refusal is not None:  # before anything of it is read: not even its file descriptors
        _refuse(conn, refusal)
        return None
    try:
        conn.settimeout(10)
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        (size,) = HEADER.unpack(_recv_exactly(conn, HEADER.size))
        request = json.loads(_recv_exactly(conn, size))
        conn.settimeout(None)
        presented = request.pop("secret", None)
    except (OSError, ValueError, struct.error, AttributeError) as exc:
        log.warning("bad_request", extra={"error": repr(exc)})
        conn.close()
        return None
    if not isinstance(presented, str) or not hmac.compare_digest(presented.encode(), serving.secret.encode()):
        _refuse(conn, "wrong secret" if presented else "no secret", fds)
        return None
    job = Job(conn, list(fds), request, serving.server_env, serving.added_env)
    reason = cold_reason(serving.server_env, request["env"], request["cwd"], serving.imported)
    if reason is None and len(os.listdir("/proc/self/task")) != 1:
        reason = "the warm server has more than one thread"
    if reason is None and len(fds) != 3:
        reason = "the job's output was not passed to the warm server"
    if reason is not None:
        _send(conn, {"cold": reason})
        log.info("cold", extra={"job_id": _job_id(job), "reason": reason})
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    return job


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("the client closed the connection mid-request")
        data += chunk
    return bytes(data)


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client is gone; its child notices on its own
        conn.sendall(json.dumps(message).encode() + b"\n")


def _job_id(job: Job) -> str | None:
    return job.request.get("env", {}).get("TRAINMASTER_JOB_ID")


# -- the forked child -------------------------------------------------------------------------------


def run_child(job: Job) -> int:
    """Become the job's driver: its session, output, directory, environment, sys.path and arguments."""
    import threading
    from importlib import import_module

    os.setsid()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # nothing of the server's goes into the job's output
    for target_fd, fd in enumerate(job.fds):
        os.dup2(fd, target_fd)
        os.close(fd)
    request = job.request
    os.chdir(request["cwd"])
    env = {**job.server_env, **job.added_env, **request["env"]}
    env[ENV_START] = json.dumps({"warm": True, "reason": None, "started_at": request["started_at"]})
    sys.path[:1] = code_paths(job.server_env, env, request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    module, _, function = target().partition(":")
    sys.argv = [module, *request["argv"]]
    _retitle(" ".join([sys.executable, "-m", module, *request["argv"]]))  # as a cold driver shows
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=_end_with_client, args=(job.conn,), name="warm-client", daemon=True).start()
    result = getattr(import_module(module), function)(request["argv"])
    return int(result or 0)


def _retitle(title: str) -> None:
    """What `ps` shows for the child: the driver it is, not the server it was forked from (with Ray's
    own setproctitle, which titles its workers `ray::…` the same way)."""
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None and hasattr(raylet, "setproctitle"):
        raylet.setproctitle(title)


def _end_with_client(conn: socket.socket) -> None:
    """The client sends nothing more: end of file means it is gone (killed), and so is the job."""
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def serve_main(path: str) -> int:
    json_logs.configure_logger(log.name)  # not the root: each driver it forks is a job's process
    job = serve(Path(path), float(os.environ.get(ENV_IDLE_S) or DEFAULT_IDLE_S))
    return 0 if job is None else run_child(job)
