"""The job's Ray entrypoint, `python -m workers.warm --job-id ID --attempt N`: a warm driver.

A job's driver (workers/driver.py) used to spend about 1.3 s of this 2-core machine starting Python and
importing trainmaster, Ray and Ray Train before it could ask for the Ray Train controller; every job
paid it again. This entrypoint is a small client (it imports only the standard library) that hands the
job to its node's warm server: a process that has those modules imported already and forks a child
that runs `workers.driver.main` in the job's environment, working directory, arguments and output
(its stdin, stdout and stderr are passed over a Unix socket). The child calls `ray.init` itself,
after the fork, so it is the job's Ray driver exactly as a cold one is.

The client stays the Ray job's entrypoint process: Ray's stop signals go to it and it forwards them;
it exits with the child's status (a death by signal as the same signal). If the client is killed, its
socket closes and the child ends too. The server reaps its children and reports each one's status.

The job starts cold, as before (this process execs `python -m workers.driver`), and its `driver`
event says why, when:
- no server answers on this node: the client starts one, detached, and the next job is warm;
- the job installs `pip` packages (Ray runs it in its own virtualenv);
- its environment differs from the server's where imports read it (PYTHON*, RAY_*, LD_*, ...; the
  job's TRAINMASTER_* variables and Ray's per-job RAY_JOB_CONFIG_JSON_ENV_VAR are applied in the child);
- its code (working directory, PYTHONPATH) has a top-level module the server has already imported;
- the server is not single-threaded (a fork would copy a lock some other thread holds).

Servers live in TRAINMASTER_WARM_DIR (default /tmp/trainmaster-warm-<uid>, mode 0700: the jobs'
environments carry their tokens), one socket per Python executable and installed code (its files'
sizes and times) and environment, so an upgrade starts a new server and each Ray cluster of a node has
its own; a server exits once its cluster is gone (`trainmaster down`) or after TRAINMASTER_WARM_IDLE_S
(default 1800) without a job. Each logs to <socket>.log, removed when it exits
cleanly. TRAINMASTER_WARM_DRIVER=0 on the dispatcher launches `workers.driver` directly instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

ENV_START = "TRAINMASTER_DRIVER_START"  # how this driver started, for its `driver` event (JSON)
ENV_DIR = "TRAINMASTER_WARM_DIR"
ENV_IDLE_S = "TRAINMASTER_WARM_IDLE_S"
ENV_TARGET = "TRAINMASTER_WARM_TARGET"  # module:function the child runs; tests give their own
DEFAULT_TARGET = "workers.driver:main"
DEFAULT_IDLE_S = 1800.0
# Variables Python, Ray and native libraries read when they are imported or loaded: a job whose
# values differ from the server's would not get what it asked for from a fork.
IMPORT_TIME = ("PYTHON", "RAY_", "LD_", "GRPC_", "JE_", "MALLOC")
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
PER_JOB = (RAY_JOB_CONFIG, "PYTHONPATH")  # read by ray.init / applied to sys.path
# What the server imports before it serves: everything the driver needs to build a trainer.
PRELOAD = (
    "ray",
    "ray.train",
    "ray.train.v2.api.data_parallel_trainer",
    "workers.callbacks",
    "workers.lean_torch",
    "workers.frameworks.torch",
)
# Set while the server imports: without them OpenBLAS and pyarrow's jemalloc each start a thread
# at load, and a process with threads is not safe to fork. A driver computes nothing with either.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
CLUSTER_CHECK_S = 5.0  # how often an idle server checks that its Ray cluster is still there
STARTING_STALE_S = 120.0  # a start lock older than this was left by a server that died starting
_HEADER = struct.Struct("!Q")


# -- client -----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    spec = _spec(os.environ)  # parsed once: it can be a megabyte
    reason = _client_cold_reason(spec)
    if reason is None:
        base = server_env(os.environ, os.getcwd(), spec)
        path = socket_path(base)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(path))
        except OSError:
            conn.close()
            reason = _start_server(path, base)
        else:
            with conn:
                try:
                    answer = _ask(conn, args)
                except OSError as exc:
                    answer = {"cold": f"could not hand the job to the warm server: {exc}"}
                if "pid" in answer:
                    return _wait_child(conn, int(answer["pid"]))
                reason = str(answer.get("cold", "the warm server refused the job"))
    return _exec_cold(args, reason)


def _client_cold_reason(spec: Mapping[str, Any]) -> str | None:
    if sys.platform != "linux" or not hasattr(os, "pidfd_open"):
        return "warm drivers need Linux 5.3 or newer"
    if spec.get("pip"):
        return "the job installs pip packages (Ray gives it its own virtualenv)"
    return None


def _spec(env: Mapping[str, str]) -> dict[str, Any]:
    """The job's spec as the dispatcher wrote it (trainmaster.context.ENV_JOB_SPEC). Read here, not
    through JobContext, because this client must start in milliseconds: trainmaster imports httpx."""
    try:
        spec = json.loads(env.get("TRAINMASTER_JOB_SPEC") or "{}")
    except ValueError:
        return {}
    return spec if isinstance(spec, dict) else {}


def warm_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path(tempfile.gettempdir()) / f"trainmaster-warm-{os.getuid()}")


def socket_path(env: Mapping[str, str]) -> Path:
    """One server per Python executable, target, installed code and what imports read of `env` (a
    server's environment): a change starts a new one, and each Ray cluster of a node has its own."""
    from importlib.machinery import PathFinder

    read = sorted((name, value) for name, value in env.items() if _import_time(name))
    digest = hashlib.sha256(json.dumps([sys.executable, _target(), read, _entries(env)]).encode())
    here = Path(__file__).resolve().parent
    ray = PathFinder.find_spec("ray", sys.path[1:])  # the installed one, not the job's (sys.path[0])
    files = [Path(ray.origin)] if ray is not None and ray.origin else []
    for root in (here, here.parent / "trainmaster"):
        files += sorted(root.rglob("*.py"))
    for file in files:
        stat = file.stat()
        digest.update(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return warm_dir() / f"{digest.hexdigest()[:24]}.sock"


def _private_dir(folder: Path) -> str | None:
    """The folder, made if missing; None if it is safe, else why not (another user could listen there)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        stat = folder.stat()
    except OSError as exc:
        return f"cannot use {folder}: {exc}"
    if stat.st_uid != os.getuid() or stat.st_mode & 0o077:
        return f"{folder} is not private to this user (owner {stat.st_uid}, mode {stat.st_mode & 0o777:o})"
    return None


def _start_server(path: Path, base: Mapping[str, str]) -> str:
    """Start this node's server for the next job (detached: Ray's stop of this job must not end it)."""
    unsafe = _private_dir(path.parent)
    if unsafe is not None:
        return f"no warm server: {unsafe}"
    lock, log = path.with_suffix(".starting"), path.with_suffix(".log")
    try:
        if time.time() - lock.stat().st_mtime > STARTING_STALE_S:
            lock.unlink()  # its starter died before it could listen
    except OSError:
        pass
    try:
        failed = not lock.exists() and time.time() - log.stat().st_mtime < STARTING_STALE_S
    except OSError:
        failed = False  # no log: no server has tried (a clean exit removes its log)
    if failed:
        return f"the node's warm server failed recently; see {log}"
    try:
        # One starter at a time: the server removes the lock once it listens (or fails to).
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return "the node's warm server is starting"
    env = {**base, **SINGLE_THREADED}
    middle = os.fork()  # the server is not this job's child: Ray stops a job's whole process tree
    if middle == 0:
        try:
            os.setsid()
            with open(log, "ab") as out:
                subprocess.Popen(
                    [sys.executable, "-m", "workers.warm", "--serve", str(path)],
                    env=env,
                    cwd=path.parent,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                )
        finally:
            os._exit(0)
    os.waitpid(middle, 0)
    return "no warm server was running on this node (one is starting for the next job)"


def server_env(env: Mapping[str, str], cwd: str, spec: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The environment a server imports with: this job's, less what is the job's own (its TRAINMASTER_*
    variables, its `env`, its Ray job config, its code on PYTHONPATH)."""
    own = set(((_spec(env) if spec is None else spec).get("env")) or {})
    kept = {
        name: value
        for name, value in env.items()
        if name not in own and name != RAY_JOB_CONFIG and (not name.startswith("TRAINMASTER_") or "_WARM_" in name)
    }
    paths = [entry for entry in _entries(env) if entry != cwd]
    kept.pop("PYTHONPATH", None)
    if paths:
        kept["PYTHONPATH"] = os.pathsep.join(paths)
    return kept


def _ask(conn: socket.socket, args: list[str]) -> dict[str, Any]:
    request = json.dumps(
        {"argv": args, "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid(), "started_at": started_at()}
    ).encode()
    socket.send_fds(conn, [b"F"], [0, 1, 2])
    conn.sendall(_HEADER.pack(len(request)) + request)
    return _read_line(conn) or {"cold": "the warm server closed the connection"}


def _wait_child(conn: socket.socket, pid: int) -> int:
    """Forward Ray's stop signals to the child until the server reports its status."""
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        answer = _read_line(conn)
    except OSError:
        answer = None
    if answer is None or "exit" not in answer:
        print("[trainmaster] error: the job's driver ended without an exit status", file=sys.stderr, flush=True)
        return 128 + received[-1] if received else 1
    code = int(answer["exit"])
    if code < 0:  # died by a signal: so does this process, so Ray sees what a cold driver shows
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _read_line(conn: socket.socket) -> dict[str, Any] | None:
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(4096)
        except InterruptedError:
            continue
        if not chunk:
            return None
        data += chunk
    answer = json.loads(data)
    return answer if isinstance(answer, dict) else None


def _exec_cold(args: list[str], reason: str) -> NoReturn:
    """Become the driver the old way, in this process (Ray's stop and exit status work as before)."""
    os.environ[ENV_START] = json.dumps({"warm": False, "reason": reason, "started_at": started_at()})
    module, _, function = _target().partition(":")
    if _target() == DEFAULT_TARGET:
        command = ["-m", module]
    else:
        command = ["-c", f"import sys, {module}; sys.exit({module}.{function}(sys.argv[1:]))"]
    os.execv(sys.executable, [sys.executable, *command, *args])


def started_at() -> float:
    """When this process started, in Unix seconds to the clock tick (psutil's create_time adds the
    boot time rounded to the second, so it can be a second off); now, where there is no /proc."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):
        return time.time()
    return time.time() - age


# -- server -----------------------------------------------------------------------------------------


@dataclass
class Job:
    """A job handed to the server: what the forked child runs."""

    conn: socket.socket
    fds: list[int]
    request: dict[str, Any]
    server_env: dict[str, str]
    added_env: dict[str, str]  # what the server's imports set in its environment (a cold driver's would too)


def _import_time(name: str) -> bool:
    return name.startswith(IMPORT_TIME) and name not in PER_JOB


def _entries(env: Mapping[str, str]) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


def code_paths(server: Mapping[str, str], job: Mapping[str, str], cwd: str) -> list[str]:
    """The job's own sys.path entries: its working directory (`python -m` puts it first) and the
    PYTHONPATH entries the server lacks (Ray adds the job's working_dir there)."""
    shared = set(_entries(server))
    return [cwd, *(entry for entry in _entries(job) if entry not in shared and entry != cwd)]


def cold_reason(
    server: Mapping[str, str], job: Mapping[str, str], cwd: str, imported: Mapping[str, str | None]
) -> str | None:
    """Why a job cannot run in a child of this server (None: it can). `imported`: the server's
    top-level modules and their files."""
    for name in sorted(set(server) | set(job)):
        if _import_time(name) and server.get(name) != job.get(name):
            return f"its {name} differs from the warm server's"
    own = code_paths(server, job, cwd)
    if [entry for entry in _entries(job) if entry not in own] != _entries(server):
        return "its PYTHONPATH differs from the warm server's"
    for folder in own:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
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
    _log("starting", path=str(path))
    # What jobs are compared against: the environment the imports below read (`import ray` adds some).
    server_environ = {name: value for name, value in os.environ.items() if name not in SINGLE_THREADED}
    try:
        for name in (*PRELOAD, _target().partition(":")[0]):
            __import__(name)
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(64)
    finally:
        path.with_suffix(".starting").unlink(missing_ok=True)
    imported = _top_level_modules()
    added = {name: value for name, value in os.environ.items() if name not in server_environ}  # by imports
    _log("listening", path=str(path), target=_target(), modules=len(sys.modules))
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
                    job = _accept(listener, server_environ, added, imported)
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
                    _log("forked", pid=child, job_id=_job_id(job))
                else:
                    pidfd = int(key.fd)
                    selector.unregister(pidfd)
                    child, conn = children.pop(pidfd)
                    os.close(pidfd)
                    _, status = os.waitpid(child, 0)
                    code = os.waitstatus_to_exitcode(status)
                    _send(conn, {"exit": code})
                    conn.close()
                    _log("exited", pid=child, code=code)
                    idle_since = time.monotonic()
    finally:
        if os.getpid() == pid:  # not in a child on its way out of this function
            path.unlink(missing_ok=True)
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


def _accept(
    listener: socket.socket,
    server_environ: dict[str, str],
    added: dict[str, str],
    imported: Mapping[str, str | None],
) -> Job | None:
    """A job's request and output; None when it goes cold (the client was told why) or was malformed."""
    conn, _ = listener.accept()
    try:
        conn.settimeout(10)
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        (size,) = _HEADER.unpack(_recv_exactly(conn, _HEADER.size))
        request = json.loads(_recv_exactly(conn, size))
        conn.settimeout(None)
    except (OSError, ValueError, struct.error) as exc:
        _log("bad_request", error=repr(exc))
        conn.close()
        return None
    job = Job(conn, list(fds), request, server_environ, added)
    reason = cold_reason(server_environ, request["env"], request["cwd"], imported)
    if reason is None and len(os.listdir("/proc/self/task")) != 1:
        reason = "the warm server has more than one thread"
    if reason is None and len(fds) != 3:
        reason = "the job's output was not passed to the warm server"
    if reason is not None:
        _send(conn, {"cold": reason})
        _log("cold", job_id=_job_id(job), reason=reason)
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


def _target() -> str:
    return os.environ.get(ENV_TARGET) or DEFAULT_TARGET


def _log(event: str, **fields: Any) -> None:
    print(json.dumps({"ts": round(time.time(), 3), "pid": os.getpid(), "event": event, **fields}), flush=True)


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
    env = {**job.added_env, **request["env"]}
    env[ENV_START] = json.dumps({"warm": True, "reason": None, "started_at": request["started_at"]})
    sys.path[:1] = code_paths(job.server_env, env, request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    module, _, function = _target().partition(":")
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


def _serve_main(path: str) -> int:
    job = serve(Path(path), float(os.environ.get(ENV_IDLE_S) or DEFAULT_IDLE_S))
    return 0 if job is None else run_child(job)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(_serve_main(sys.argv[2]))
    sys.exit(main())
