"""The job's Ray entrypoint, `python -m workers.warm --job-id ID --attempt N`: a warm driver (client.py,
the entrypoint process; server.py, a node's server and the children it forks).

A cold driver (workers/driver.py in a fresh Python) spends most of its start importing trainmaster, Ray
and Ray Train before it can ask for the Ray Train controller, and every job would pay that again
(bench/README.md has the figures). This entrypoint is a small client (it imports only the standard
library) that hands the job to its node's warm server: a process that has those modules imported
already and forks a child that runs `workers.driver.main` in the job's environment, working
directory, arguments and output (its stdin, stdout and stderr are passed over a Unix socket). The
child calls `ray.init` itself, after the fork, so it is the job's Ray driver exactly as a cold one is.

The client stays the Ray job's entrypoint process: Ray's stop signals go to it and it forwards them;
it exits with the child's status (a death by signal as the same signal). If the client is killed, its
socket closes and the child ends too. The server reaps its children and reports each one's status.

The job starts cold instead (this process execs `python -m workers.driver`), and its `driver`
event says why, when:
- no server answers on this node: the client starts one, detached, and the next job is warm;
- the job installs `pip` packages (Ray runs it in its own virtualenv);
- its environment differs from the server's where imports read it (PYTHON*, RAY_*, LD_*, ...; the
  job's TRAINMASTER_* variables and Ray's per-job RAY_JOB_CONFIG_JSON_ENV_VAR are applied in the child);
- its code (working directory, PYTHONPATH) has a top-level module the server has already imported;
- the server is not single-threaded (a fork would copy a lock some other thread holds);
- Ray's job supervisor did not start it (no RAY_JOB_CONFIG_JSON_ENV_VAR declares its environment);
- the socket's folder is not private, or the server refused the job (below).

Servers live in TRAINMASTER_WARM_DIR (default /tmp/trainmaster-warm-<uid>), one socket per Python
executable and installed code (its files' sizes and times) and environment, so an upgrade starts a new
server and each Ray cluster of a node has its own; a server exits once its cluster is gone (`trainmaster
down`) or after TRAINMASTER_WARM_IDLE_S (default 1800) without a job. Each logs to <socket>.log, removed
when it exits cleanly. TRAINMASTER_WARM_DRIVER=0 on the dispatcher launches `workers.driver` directly.

Who may hand a server a job (a job's driver runs with the node's Ray credentials, so a server is a
trust boundary of its cluster):
- the folder: a directory owned by the server's user with mode 0700, made so when missing. Client and
  server refuse one that exists with another owner, a wider mode or as a symlink (someone else could
  listen there or read the secret): remove it, or point TRAINMASTER_WARM_DIR at a private folder; until
  then every job starts cold and says so.
- the peer: the server reads each connection's SO_PEERCRED and refuses (and logs) a process of
  another uid, whatever the folder's mode lets through.
- the secret: each server writes a fresh random secret to <socket>.secret (mode 0600, beside its
  socket, before it listens; removed when it exits) and the client presents it in its request; a
  wrong one is refused and logged. It is a file, not a node variable, so it never enters a job's
  environment, and each server, so each Ray cluster of a node, has its own. Like the folder it keeps
  out other users only: the server's own user can read it, so the boundary is the uid, and clusters
  that must not trust each other on one node run their Ray as different users.
- the environment: the client sends only the job's declared variables (`declared_env`): those the
  dispatcher set for the job (its runtime_env's env_vars, as Ray's RAY_JOB_CONFIG_JSON_ENV_VAR records
  them: the JobContext variables, the spec's `env`, and the platform's RAY_* flags), the spec's `env`,
  and what Ray's job supervisor sets for a driver (RAY_JOB_CONFIG_JSON_ENV_VAR, RAY_ADDRESS,
  PYTHONUNBUFFERED, PYTHONPATH with the job's working_dir) plus PATH; a request carries nothing else.
  The child runs with the server's environment (the node's, that Ray gives every process there, as
  the job that started the server found it, less every TRAINMASTER_* variable and the job's own:
  client.server_env) overlaid with those.
"""

from __future__ import annotations

import os
import stat
import struct
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

ENV_START = "TRAINMASTER_DRIVER_START"  # how this driver started, for its `driver` event (JSON)
ENV_TARGET = "TRAINMASTER_WARM_TARGET"  # module:function the child runs; tests give their own
DEFAULT_TARGET = "workers.driver:main"
# Variables Python, Ray and native libraries read when they are imported or loaded: a job whose
# values differ from the server's would not get what it asked for from a fork.
IMPORT_TIME = ("PYTHON", "RAY_", "LD_", "GRPC_", "JE_", "MALLOC")
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
PER_JOB = (RAY_JOB_CONFIG, "PYTHONPATH")  # read by ray.init / applied to sys.path
# Set while the server imports: without them OpenBLAS and pyarrow's jemalloc each start a thread
# at load, and a process with threads is not safe to fork. A driver computes nothing with either.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
HEADER = struct.Struct("!Q")  # the size of a request, ahead of it
PEERCRED = struct.Struct("3i")  # SO_PEERCRED's struct ucred: pid, uid, gid
ENV_DIR = "TRAINMASTER_WARM_DIR"
# What Ray's job supervisor sets for every driver (job_supervisor._get_driver_env_vars), the job's
# code on PYTHONPATH, and PATH: sent with the job's own variables (declared_env).
DRIVER_ENV = (RAY_JOB_CONFIG, "RAY_ADDRESS", "PYTHONUNBUFFERED", "PYTHONPATH", "PATH")


def warm_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path(tempfile.gettempdir()) / f"trainmaster-warm-{os.getuid()}")


def private_dir_problem(folder: Path) -> str | None:
    """None if `folder` is a real directory of this user that no one else can open; else what is
    wrong and what to do about it."""
    try:
        info = os.lstat(folder)
    except OSError as exc:
        return f"cannot use {folder}: {exc}"
    mode = info.st_mode
    if stat.S_ISDIR(mode) and info.st_uid == os.getuid() and not mode & 0o077:
        return None
    kind = "a directory" if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode) else "not a directory"
    return (
        f"{folder} is not private to uid {os.getuid()} ({kind}, owner {info.st_uid}, mode {mode & 0o7777:o}):"
        f" remove it, or set {ENV_DIR} to a directory of this user with mode 0700"
    )


def secret_path(socket_path: Path) -> Path:
    return socket_path.with_suffix(".secret")


def read_secret(path: Path) -> str:
    """The server's secret; OSError when it cannot be read or is not private to this user."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise PermissionError(
                f"{path} is not private (owner {info.st_uid}, mode {info.st_mode & 0o777:o}):"
                " remove it (its server's next start writes a new one)"
            )
        return os.read(fd, 1024).decode().strip()
    finally:
        os.close(fd)


def target() -> str:
    """module:function that a forked child (or a cold driver) runs."""
    return os.environ.get(ENV_TARGET) or DEFAULT_TARGET


def import_time(name: str) -> bool:
    return name.startswith(IMPORT_TIME) and name not in PER_JOB


def entries(env: Mapping[str, str]) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


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
