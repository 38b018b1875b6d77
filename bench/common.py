"""What the benchmarks in bench/ share: the run record and its facts, a scratch database, the API as a
process, a local stack, percentiles.

The scripts run as `.venv/bin/python bench/<name>.py`, so bench/ is on `sys.path` (also in the processes
they spawn) and they import this module as `common`. They reach trainmaster only through its public
surfaces: the HTTP API, the SDK, and the `trainmaster` console script run as a subprocess. psycopg is
used directly for the scratch database and for the peers.

A script measures inside `with run(name, args) as record:` and fills `record.tables` (lists of rows)
and `record.ratios`; on a clean exit the record, with the facts read at the start and the end of the
run, goes to bench/results/<name>.json. `bench/report.py` turns those files into tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
from psycopg import sql

import trainmaster as tm

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TRAINMASTER = str(Path(sys.executable).with_name("trainmaster"))
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


# --------------------------------------------------------------------------- the run and its facts


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The script's docstring as written, and each option's default (where it has one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, argparse.SUPPRESS):
            return action.help or ""
        return f"{action.help} (default: %(default)s)"


def parser(doc: str | None, database: bool = False) -> argparse.ArgumentParser:
    """An argument parser with the options every script has (and `--database-url` where it makes one)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=HelpFormatter)
    if database:
        parser.add_argument("--database-url", default=ADMIN_URL, help="PostgreSQL server for the tm_bench_* database")
    parser.add_argument("--quiet-load", type=float, default=1.5, help="first wait for a 1-minute load below this")
    parser.add_argument("--quiet-timeout", type=float, default=300.0, help="longest wait for it, in seconds")
    parser.add_argument("--output", type=Path, help="results file; by default bench/results/<name>.json")
    return parser


def load_1m() -> float:
    return os.getloadavg()[0]


def version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str:
    """HEAD, with '+dirty' when the working tree differs from it (read-only git calls)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()

    try:
        return git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Record:
    """What a run writes: its command, configuration and facts, its tables (lists of rows) and ratios."""

    benchmark: str
    command: str
    config: dict[str, Any]
    facts: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ratios: list[dict[str, Any]] = field(default_factory=list)
    valid: bool = True

    def ratio(self, figure: str, value: float, peer: str, peer_value: float) -> None:
        """A figure against its peer's, as `value / peer_value`."""
        self.ratios.append(
            {"figure": figure, "value": value, "peer": peer, "peer_value": peer_value, "ratio": value / peer_value}
        )

    def read_postgres(self, database_url: str) -> None:
        with psycopg.connect(database_url, connect_timeout=10) as conn:
            row = conn.execute("SELECT version()").fetchone()
        self.facts["postgresql"] = str(row[0]) if row else None


def raise_on_sigterm() -> None:
    """SIGTERM ends the script like Ctrl-C does, through every `finally` (processes, database, stack)."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def run(name: str, args: argparse.Namespace) -> Iterator[Record]:
    """Wait for a quiet machine, read the facts, measure (the block), read the load again, write the JSON.
    Nothing is written when the block fails."""
    raise_on_sigterm()
    began = time.monotonic()
    while load_1m() >= args.quiet_load and time.monotonic() - began < args.quiet_timeout:
        print(f"1-minute load average {load_1m():.2f} >= {args.quiet_load:g}; waiting", flush=True)
        time.sleep(10)
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_1m_start": load_1m(),
        "quiet_wait_s": round(time.monotonic() - began),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "ray": version("ray"),
        "postgresql": None,
        "git": git_commit(),
        "started_at": now(),
    }
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = Record(name, " ".join([os.path.relpath(sys.executable, REPO), *sys.argv]), config, facts)
    yield record
    facts.update(load_1m_end=load_1m(), finished_at=now())
    output = args.output or RESULTS / f"{name}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(asdict(record), indent=2) + "\n")
    for r in record.ratios:
        print(f"{r['figure']}: {number(r['value'])} against {r['peer']} {number(r['peer_value'])}: {r['ratio']:.3g}x")
    print(f"results written to {output}" + ("" if record.valid else " (marked INVALID: see its tables)"))


# --------------------------------------------------------------------------- numbers


def number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1] if ordered else math.nan


def ms(values: Sequence[float], *pcts: float) -> dict[str, float]:
    """Percentiles of durations in seconds, in milliseconds: {"p50_ms": ..., ...}."""
    return {f"p{pct:g}_ms": percentile(values, pct) * 1000 for pct in pcts}


# --------------------------------------------------------------------------- a scratch database


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run the `trainmaster` console script; its stdout, or an error with its output."""
    result = subprocess.run(
        [TRAINMASTER, *args], env=env or os.environ.copy(), capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"trainmaster {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result.stdout


@contextlib.contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A new database `tm_bench_<random>` on the server of `admin_url`, dropped at the end."""
    admin_url = admin_url.replace("postgresql+psycopg://", "postgresql://", 1)
    name = f"tm_bench_{secrets.token_hex(4)}"

    def admin(statement: sql.SQL) -> None:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement.format(sql.Identifier(name)))

    admin(sql.SQL("CREATE DATABASE {}"))
    try:
        print(f"database {name} created", flush=True)
        yield urlsplit(admin_url)._replace(path=f"/{name}").geturl()
    finally:
        admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)"))
        print(f"database {name} dropped", flush=True)


def migrate_and_token(database_url: str, project: str = "bench") -> str:
    """`trainmaster db upgrade`, then a project token from `trainmaster token create`."""
    env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url}
    cli("db", "upgrade", env=env)
    return cli("token", "create", "--project", project, env=env).split()[-1]


# --------------------------------------------------------------------------- the API as a process


@dataclass(frozen=True)
class Api:
    url: str
    pid: int  # also its process group: uvicorn's workers are in it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def api_process(database_url: str, workers: int | None = 1, cpus: str | None = None) -> Iterator[Api]:
    """`trainmaster api` on a free loopback port, ready, in its own process group; stopped at the end.
    `workers` None: the API's own default; `cpus`: pinned there with `taskset -c` (workers included)."""
    port = free_port()
    command = [TRAINMASTER, "api", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", str(workers)] if workers is not None else []
    command = ["taskset", "-c", cpus, *command] if cpus else command
    env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url}
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            api = Api(f"http://127.0.0.1:{port}", process.pid)
            deadline = time.monotonic() + 60
            while not ready(api.url):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"trainmaster api did not become ready:\n{log.read()[-3000:].decode()}")
                time.sleep(0.2)
            yield api
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # a uvicorn worker left behind, if any


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def submit_job(api_url: str, token: str) -> str:
    """A job submitted over HTTP; no dispatcher runs beside a bare API, so it stays queued."""
    body = {"name": "bench", "entrypoint": "builtin:mlp"}
    response = httpx.post(f"{api_url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    response.raise_for_status()
    return str(response.json()["id"])


# --------------------------------------------------------------------------- a local stack


@dataclass(frozen=True)
class Stack:
    home: Path
    api_url: str
    token: str
    database_url: str
    ray_gcs: str


@contextlib.contextmanager
def local_stack(nodes: int = 1) -> Iterator[Stack]:
    """`trainmaster up --api-port 0` in a fresh TRAINMASTER_HOME; `trainmaster down` at the end. The home is
    removed unless the block failed (its logs/ then stay for reading)."""
    home = Path(tempfile.mkdtemp(prefix="tm-bench-"))
    unset = ("TRAINMASTER_DATABASE_URL", "TRAINMASTER_API_URL", "TRAINMASTER_TOKEN", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in unset} | {"TRAINMASTER_HOME": str(home)}
    failed = True
    try:
        print(f"starting a stack in {home}", flush=True)
        cli("up", "--api-port", "0", "--nodes", str(nodes), env=env, timeout=600)
        config = json.loads((home / "config").read_text())  # the SDK's config file
        state = json.loads((home / "stack.json").read_text())  # the stack's own record of its addresses
        yield Stack(home, config["api_url"], config["token"], state["database_url"], state["ray_gcs"])
        failed = False
    finally:
        print("stopping the stack", flush=True)
        try:
            cli("down", env=env, timeout=300)
        except (RuntimeError, subprocess.SubprocessError) as exc:
            print(f"WARNING: {exc}", file=sys.stderr)
            failed = True
        if failed:
            print(f"the stack's logs are kept in {home / 'logs'}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)


def wait_cluster_idle(client: tm.Client, timeout_s: float = 120.0) -> None:
    """Wait until every Ray CPU is free again (the previous job's gang released), as GET /v1/cluster says."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.cluster()
        if info.reachable and info.total.get("CPU") and info.free.get("CPU") == info.total.get("CPU"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray CPUs still in use after {timeout_s:.0f} s: {info.free} free of {info.total}")
        time.sleep(0.5)
