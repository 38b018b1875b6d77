"""The warm driver's client, the job's Ray entrypoint process: standard library only, so it starts in
milliseconds. It hands the job to its node's server (server.py), starts one, or becomes a cold driver."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from workers.warm import (
    DEFAULT_TARGET,
    DRIVER_ENV,
    ENV_START,
    HEADER,
    RAY_JOB_CONFIG,
    SINGLE_THREADED,
    entries,
    import_time,
    private_dir_problem,
    read_secret,
    secret_path,
    started_at,
    target,
    warm_dir,
)

STARTING_STALE_S = 120.0  # a start lock older than this was left by a server that died starting


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    outcome = _run_warm(args, _spec(os.environ))  # the spec is parsed once: it can be a megabyte
    return outcome if isinstance(outcome, int) else _exec_cold(args, outcome)


def _run_warm(args: list[str], spec: Mapping[str, Any]) -> int | str:
    """The job's exit status, its driver forked by the node's warm server; or why it starts cold."""
    reason = _client_cold_reason(spec)
    if reason is not None:
        return reason
    declared = declared_env(os.environ, spec)
    if declared is None:
        return f"its environment is not declared (no {RAY_JOB_CONFIG}: not started by Ray's job supervisor)"
    base = server_env(os.environ, os.getcwd(), spec)
    path = socket_path(base)
    unsafe = _private_dir(path.parent)
    if unsafe is not None:
        return f"no warm server: {unsafe}"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return _start_server(path, base)
    with conn:
        try:
            answer = ask(conn, args, secret=read_secret(secret_path(path)), env=declared)
        except OSError as exc:
            answer = {"cold": f"could not hand the job to the warm server: {exc}"}
        if "pid" in answer:
            return _wait_child(conn, int(answer["pid"]))
        return str(answer.get("cold", "the warm server refused the job"))


def declared_env(env: Mapping[str, str], spec: Mapping[str, Any]) -> dict[str, str] | None:
    """What of `env` the warm server may see: the variables the dispatcher declared for the job (the
    runtime_env's env_vars that Ray records in RAY_JOB_CONFIG_JSON_ENV_VAR: JobContext's, the spec's
    `env`, the platform's RAY_* flags), the spec's `env`, what Ray sets for a driver (DRIVER_ENV) and
    the variables the server overrides for itself (SINGLE_THREADED). None where Ray recorded none."""
    try:
        config = json.loads(env.get(RAY_JOB_CONFIG) or "null")
        declared = config["runtime_env"].get("env_vars") or {}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    names = {*declared, *(spec.get("env") or {}), *DRIVER_ENV, *SINGLE_THREADED}
    return {name: env[name] for name in names if name in env}


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


def socket_path(env: Mapping[str, str]) -> Path:
    """One server per Python executable, target, installed code and what imports read of `env` (a
    server's environment): a change starts a new one, and each Ray cluster of a node has its own."""
    from importlib.machinery import PathFinder

    read = sorted((name, value) for name, value in env.items() if import_time(name))
    digest = hashlib.sha256(json.dumps([sys.executable, target(), read, entries(env)]).encode())
    workers = Path(__file__).resolve().parent.parent
    ray = PathFinder.find_spec("ray", sys.path[1:])  # the installed one, not the job's (sys.path[0])
    files = [Path(ray.origin)] if ray is not None and ray.origin else []
    for root in (workers, workers.parent / "trainmaster"):
        files += sorted(root.rglob("*.py"))
    for file in files:
        stat = file.stat()
        digest.update(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return warm_dir() / f"{digest.hexdigest()[:24]}.sock"


def _private_dir(folder: Path) -> str | None:
    """The folder, made if missing; None if it is safe, else why not (another user could listen there)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot use {folder}: {exc}"
    return private_dir_problem(folder)


def _start_server(path: Path, base: Mapping[str, str]) -> str:
    """Start this node's server for the next job (detached: Ray's stop of this job must not end it)."""
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
    paths = [entry for entry in entries(env) if entry != cwd]
    kept.pop("PYTHONPATH", None)
    if paths:
        kept["PYTHONPATH"] = os.pathsep.join(paths)
    return kept


def ask(conn: socket.socket, args: list[str], *, secret: str, env: Mapping[str, str]) -> dict[str, Any]:
    """Hand the job to the server: this process's stdin, stdout and stderr, then the request; its answer."""
    request = json.dumps(
        {
            "argv": args,
            "cwd": os.getcwd(),
            "env": dict(env),
            "secret": secret,
            "pid": os.getpid(),
            "started_at": started_at(),
        }
    ).encode()
    socket.send_fds(conn, [b"F"], [0, 1, 2])
    conn.sendall(HEADER.pack(len(request)) + request)
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
    """Become a cold driver in this process (exec): Ray's stop signals and exit status reach it as they reach
    any entrypoint."""
    os.environ[ENV_START] = json.dumps({"warm": False, "reason": reason, "started_at": started_at()})
    module, _, function = target().partition(":")
    if target() == DEFAULT_TARGET:
        command = ["-m", module]
    else:
        command = ["-c", f"import sys, {module}; sys.exit({module}.{function}(sys.argv[1:]))"]
    os.execv(sys.executable, [sys.executable, *command, *args])
