"""Setup, teardown and reporting shared by the benchmark scripts in bench/.

The scripts run as `.venv/bin/python bench/<name>.py`, so bench/ is on `sys.path` (also in the
processes they spawn) and they import this module as `common`. It holds only what several scripts
did the same way; what a benchmark measures stays in its own script.

- a scratch database: `scratch_database` (or `with_database`, `create_database`, `drop_database`),
  `project_token`, `job_token`
- `trainmaster api` as a subprocess: `free_port`, `start_api`, `wait_ready`, `stop_api`, `submit_job`
- a local stack (`trainmaster up/down` in its own TRAINMASTER_HOME): `Stack`, `start_stack`,
  `stop_stack`, `running_stack`, `in_temp_home`, `wait_cluster_idle`, `prepare_home`
- the machine: `load_1m`, `wait_for_quiet`, `wait_for_quiet_stack`
- processes and signals: `run_in_second_process`, `raise_on_sigterm`, `run_main`
- results: `percentile`, `git_revision`, `run_metadata`, `write_results`, `text_table`, `md_table`

The API and database helpers import `api`, `psycopg` and SQLAlchemy when called, so the stack-based
scripts, which never use them, do not load them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

if TYPE_CHECKING:
    from typing import LiteralString

    from sqlalchemy.ext.asyncio import AsyncSession

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TRAINMASTER = Path(sys.executable).with_name("trainmaster")
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
READY_TIMEOUT_S = 30.0

C = TypeVar("C")
T = TypeVar("T")


# --------------------------------------------------------------------------- a scratch database


@contextlib.contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """Create `tm_bench_<random>` on the server of `admin_url`, yield its URL, and drop it at the end."""
    name = f"tm_bench_{secrets.token_hex(4)}"
    database_url = with_database(admin_url, name)
    create_database(admin_url, name)
    try:
        print(f"database {name} created", flush=True)
        yield database_url
    finally:
        drop_database(admin_url, name)
        print(f"database {name} dropped", flush=True)


def with_database(url: str, name: str) -> str:
    """`url` with its database path replaced by `name`."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def admin_execute(admin_url: str, statement: LiteralString, name: str) -> None:
    """Run `statement` (with `{}` for the quoted database `name`) on an autocommit admin connection."""
    import psycopg
    from psycopg import sql

    from api.settings import libpq_url

    with psycopg.connect(libpq_url(admin_url), autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL(statement).format(sql.Identifier(name)))


def create_database(admin_url: str, name: str) -> None:
    admin_execute(admin_url, "CREATE DATABASE {}", name)


def drop_database(admin_url: str, name: str) -> None:
    admin_execute(admin_url, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)


def in_session(database_url: str, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """Run `work` in one session of a short-lived engine on `database_url`, then commit."""
    from api.db.session import create_engine, session_factory
    from api.settings import Settings

    async def run() -> T:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session:
                result = await work(session)
                await session.commit()
                return result
        finally:
            await engine.dispose()

    return asyncio.run(run())


def project_token(database_url: str, project: str = "bench") -> str:
    """A project token made through the real auth service, as tests/factories/auth.py does."""
    from api.auth.service import create_project_token

    return in_session(database_url, lambda session: create_project_token(session, project))


def job_token(database_url: str, job_id: str) -> str:
    """A job-scoped token, as the dispatcher gives to training code."""
    from sqlalchemy import text

    from api.auth.service import create_job_token

    async def make(session: AsyncSession) -> str:
        query = text("SELECT project_id FROM jobs WHERE id = :id")
        project_id = (await session.execute(query, {"id": uuid.UUID(job_id)})).scalar_one()
        return await create_job_token(session, project_id, uuid.UUID(job_id))

    return in_session(database_url, make)


# --------------------------------------------------------------------------- the API as a subprocess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_api(database_url: str, port: int, log_path: Path, workers: int = 1) -> subprocess.Popen[bytes]:
    """`trainmaster api` on 127.0.0.1:`port`, output to `log_path`, in its own process group."""
    env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url}
    command = [str(TRAINMASTER), "api", "--host", "127.0.0.1", "--port", str(port)]
    if workers > 1:
        command += ["--workers", str(workers)]
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,  # Ctrl-C reaches only the script, which stops the API in order
        )


def wait_ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    """Poll `{url}/readyz` until it answers 200; fail if the API exits or takes too long."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"trainmaster api exited with {process.returncode}:\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"trainmaster api not ready within {READY_TIMEOUT_S:.0f} s; see {log_path}")


def stop_api(process: subprocess.Popen[bytes], wait_s: float = 10.0, kill_group: bool = False) -> None:
    """Terminate the API (kill it after `wait_s`); with `kill_group`, also any worker left in its group."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(wait_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    if kill_group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # leftover uvicorn workers, if any


@contextlib.contextmanager
def running_api(
    database_url: str, log_path: Path, workers: int = 1, stop_wait_s: float = 10.0, kill_group: bool = False
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`trainmaster api` on a free port, ready, for the duration of the block: (its URL, its process)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_api(database_url, port, log_path, workers)
    try:
        wait_ready(url, process, log_path)
        yield url, process
    finally:
        stop_api(process, stop_wait_s, kill_group)


def submit_job(api_url: str, token: str) -> str:
    """Submit a job through the API (no dispatcher runs, so it stays queued); returns its id."""
    headers = {"Authorization": f"Bearer {token}"}
    body = {"name": "bench", "entrypoint": "builtin:mlp"}
    response = httpx.post(f"{api_url}/v1/jobs", json=body, headers=headers, timeout=10)
    response.raise_for_status()
    return str(response.json()["id"])


# --------------------------------------------------------------------------- a local stack


@dataclass(frozen=True)
class Stack:
    home: Path
    api_url: str
    token: str
    ray_gcs: str
    ray_dashboard: str

    @property
    def ray_token_path(self) -> Path:
        return self.home / "ray_auth_token"

    def ray_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.ray_token_path.read_text().strip()}"}


def stack_env(home: Path) -> dict[str, str]:
    """This process's environment for `trainmaster up/down`, with nothing pointing at another stack."""
    env = {**os.environ, "TRAINMASTER_HOME": str(home)}
    for name in ("TRAINMASTER_DATABASE_URL", "TRAINMASTER_API_URL", "TRAINMASTER_TOKEN", "RAY_ADDRESS"):
        env.pop(name, None)
    return env


def start_stack(home: Path) -> Stack:
    """`trainmaster up --api-port 0` in `home`; returns where its API and Ray head listen."""
    result = subprocess.run(
        [str(TRAINMASTER), "up", "--api-port", "0"],
        env=stack_env(home),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"trainmaster up failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    config = json.loads((home / "config").read_text())
    state = json.loads((home / "stack.json").read_text())
    return Stack(home, config["api_url"], config["token"], state["ray_gcs"], state["ray_dashboard"])


def stop_stack(home: Path) -> None:
    """`trainmaster down` for this home only (never `ray stop`: other clusters share the machine)."""
    if not (home / "stack.json").exists():
        return
    result = subprocess.run(
        [str(TRAINMASTER), "down"], env=stack_env(home), capture_output=True, text=True, timeout=300, check=False
    )
    if result.returncode != 0:
        print(f"WARNING trainmaster down failed: {result.stdout[-1000:]}{result.stderr[-1000:]}", file=sys.stderr)


def ray_cpus_in_use(stack: Stack) -> float | None:
    try:
        url = f"{stack.ray_dashboard}/api/cluster_status"
        body = httpx.get(url, headers=stack.ray_headers(), timeout=5).json()
        return float(body["data"]["clusterStatus"]["loadMetricsReport"]["usage"]["CPU"][0])
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return None


def wait_cluster_idle(stack: Stack, timeout_s: float = 120.0) -> float:
    """Wait until no Ray CPU is in use (the previous job's gang is released); returns seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if ray_cpus_in_use(stack) == 0:
            return time.monotonic() - began
        time.sleep(0.5)
    raise TimeoutError(f"the Ray cluster still had CPUs in use after {timeout_s:.0f} s")


@contextlib.contextmanager
def running_stack(home: Path) -> Iterator[Stack]:
    """A stack started in `home` for the duration of the block; stopped at the end, also on errors."""
    print(f"starting a stack in {home}", flush=True)
    try:
        yield start_stack(home)
    finally:
        print("stopping the stack", flush=True)
        stop_stack(home)


def in_temp_home(prefix: str, keep: bool, run: Callable[[Path], T]) -> T:
    """`run(home)` in a fresh temporary TRAINMASTER_HOME, removed afterwards unless `keep` or it failed."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        result = run(home)
    except BaseException:
        print(f"failed: the stack's logs are kept in {home / 'logs'}", file=sys.stderr)
        raise
    if not keep:
        shutil.rmtree(home, ignore_errors=True)
    return result


def prepare_home(home: Path, job_file: Path, *folders: str) -> list[Path]:
    """Make `home/job-code` holding only `job_file`, and the other `folders`; returns them all."""
    paths = [home / "job-code", *(home / folder for folder in folders)]
    for path in paths:
        path.mkdir(parents=True)
    shutil.copy2(job_file, paths[0] / job_file.name)
    return paths


# --------------------------------------------------------------------------- load average


def load_1m() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


@dataclass(frozen=True)
class QuietWait:
    threshold: float
    first: float
    last: float
    waited_s: float

    @property
    def quiet(self) -> bool:
        return self.last < self.threshold


def poll_load(threshold: float, max_wait_s: float, progress: Callable[[float, float], str], poll_s: float) -> QuietWait:
    """Poll the 1-minute load average until it is below `threshold` or `max_wait_s` passed;
    `progress(load, seconds so far)` is printed before each wait."""
    began, first = time.monotonic(), load_1m()
    load = first
    while load >= threshold and time.monotonic() - began < max_wait_s:
        print(progress(load, time.monotonic() - began), flush=True)
        time.sleep(poll_s)
        load = load_1m()
    return QuietWait(threshold, first, load, time.monotonic() - began)


def wait_for_quiet(threshold: float, timeout_s: float, poll_s: float = 10.0) -> dict[str, Any]:
    """Wait for a quiet machine before creating the database; the record the API benchmarks keep."""
    wait = poll_load(
        threshold, timeout_s, lambda load, _: f"1-minute load average {load:.2f} >= {threshold:g}; waiting", poll_s
    )
    return {
        "before_wait": wait.first,
        "after_wait": wait.last,
        "waited_s": round(wait.waited_s, 1),
        "quiet": wait.quiet,
    }


def wait_for_quiet_stack(threshold: float, max_wait_s: float, poll_s: float = 10.0) -> dict[str, Any]:
    """Wait for a quiet machine before the measured jobs; the record the stack benchmarks keep."""
    wait = poll_load(
        threshold,
        max_wait_s,
        lambda load, so_far: f"  load {load:.2f} >= {threshold}; waiting ({so_far:.0f} s so far)",
        poll_s,
    )
    if not wait.quiet:
        print(f"  load still {wait.last:.2f} after {max_wait_s:.0f} s; measuring anyway", flush=True)
    return {
        "threshold": threshold,
        "load_first": wait.first,
        "load_last": wait.last,
        "waited_s": wait.waited_s,
        "quiet": wait.quiet,
    }


# --------------------------------------------------------------------------- processes and signals


def child_main(work: Callable[[C], dict[str, Any]], config: C, results: multiprocessing.Queue[tuple[str, Any]]) -> None:
    """Entry point of a load process: the parent owns Ctrl-C and ends this process itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        results.put(("ok", work(config)))
    except Exception:
        results.put(("error", traceback.format_exc()))


def run_in_second_process(
    work: Callable[[C], dict[str, Any]], config: C, kind: str, process_name: str, budget_s: float
) -> dict[str, Any]:
    """`work(config)` in a spawned process (a module-level function of the script); its result, or an error
    naming the `kind` of load. The process is ended on Ctrl-C, SIGTERM or after `budget_s` of silence."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[tuple[str, Any]] = context.Queue()
    process = context.Process(target=child_main, args=(work, config, results), name=process_name)
    process.start()
    try:
        status, payload = results.get(timeout=budget_s)
    except BaseException as exc:  # Ctrl-C, SIGTERM or a silent child: end the load process now
        process.terminate()
        if isinstance(exc, queue.Empty):
            raise RuntimeError(f"the {kind} load process sent nothing within {budget_s:.0f} s") from None
        raise
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    if status != "ok":
        raise RuntimeError(f"the {kind} load process failed:\n{payload}")
    return dict(payload)


def raise_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so `finally` blocks clean up as on Ctrl-C."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def run_main(main: Callable[[], int], interrupted: str) -> None:
    """Exit with `main()`'s status; on Ctrl-C print `interrupted` (what was cleaned up) and exit 130."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"interrupted: {interrupted}", file=sys.stderr)
        sys.exit(130)


# --------------------------------------------------------------------------- results


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not values:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(values)))
    return values[rank - 1]


def git_revision(short: bool = False) -> str:
    """HEAD (abbreviated if `short`), with '+dirty' when the working tree differs from it (read-only git calls)."""
    rev_parse = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
    try:
        head = subprocess.run(rev_parse, cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_metadata(
    name: str, args: argparse.Namespace, loadavg: dict[str, Any], python: str, short_git: bool = False
) -> dict[str, Any]:
    """The keys every results file starts with: what ran, when, where, at which revision, under what load."""
    return {
        "benchmark": name,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([python, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "git": git_revision(short=short_git),
        "loadavg_1m": loadavg,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


def write_results(results: dict[str, Any], output: Path, markdown: tuple[Path, str] | None = None) -> None:
    """Write the JSON results to `output` and, if given, the markdown section to its path; say where."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    if markdown is None:
        print(f"results written to {output}")
        return
    path, text = markdown
    path.write_text(text)
    print(f"results written to {output} and {path}")


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
