"""The harness every script in bench/ runs in: options, the run record with the machine's facts (written
as JSON), the stack under measurement (a scratch PostgreSQL database with `trainmaster api` on it, a
whole `trainmaster up`, a bare Ray head), timing and percentiles.

Scripts run as `.venv/bin/python bench/<name>.py` (bench/ is on `sys.path`, also in the processes they
spawn) and measure inside `with run(name, args) as record:`, filling `record.tables` (lists of rows) and
`record.ratios`; on a clean exit the record goes to bench/results/<name>.json, which bench/report.py
turns into tables. SIGTERM and Ctrl-C go through every `finally` (processes, databases, stacks); a
failed run writes nothing.
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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
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
from trainmaster.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TRAINMASTER = str(Path(sys.executable).with_name("trainmaster"))
Option = tuple[Any, ...]  # (flag, default, help[, more add_argument keywords])
RUNS: list[Option] = [
    ("--runs", 5, "measured runs of each path"),
    ("--warmup", 1, "unmeasured runs of each path first"),
    ("--workers", 2, "Ray Train workers"),
]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The script's docstring as written, and each option's default (where it has one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return (action.help or "") + ("" if action.default in (None, argparse.SUPPRESS) else " (default: %(default)s)")


def parse_args(doc: str | None, *options: Option, database: bool = False) -> argparse.Namespace:
    """The options every script has (and `--database-url` where it makes a database), then its own. The
    type follows the default: a list takes one or more of its items' type, False is a switch."""
    p = argparse.ArgumentParser(description=doc, formatter_class=HelpFormatter)
    common: list[Option] = [
        ("--database-url", "postgresql://postgres@127.0.0.1:5432/postgres", "server of a tm_bench_* database"),
        ("--quiet-load", 1.5, "first wait for a 1-minute load below this"),
        ("--quiet-timeout", 300.0, "longest wait for it, in seconds"),
        ("--output", None, "results file; by default bench/results/<name>.json", {"type": Path}),
    ]
    for flag, default, help_text, *more in [*common[not database :], *options]:
        kind: dict[str, Any] = {"type": type(default)}
        if isinstance(default, list):
            kind = {"type": type(default[0]), "nargs": "+"}
        if default is False or "action" in (more[0] if more else {}):
            kind = {"action": "store_true"}
        p.add_argument(flag, default=default, help=help_text, **(kind | (more[0] if more else {})))
    return p.parse_args()


def load_1m() -> float:
    return os.getloadavg()[0]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def machine_facts() -> dict[str, Any]:
    """What the report states about the machine and the code: CPUs, load, versions, git commit."""

    def version(distribution: str) -> str | None:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(distribution)
        return None

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()

    try:  # HEAD, with '+dirty' when the working tree differs from it (read-only git calls)
        commit = git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain") else "")
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {
        "cpus": os.cpu_count(),
        "load_1m_start": load_1m(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "ray": version("ray"),
        "postgresql": None,
        "git": commit,
        "started_at": now(),
    }


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
        row = {"figure": figure, "value": value, "peer": peer, "peer_value": peer_value}
        self.ratios.append(row | {"ratio": value / peer_value})

    def read_postgres(self, database_url: str) -> None:
        with psycopg.connect(database_url, connect_timeout=10) as conn:
            row = conn.execute("SELECT version()").fetchone()
        self.facts["postgresql"] = str(row[0]) if row else None


@contextlib.contextmanager
def run(name: str, args: argparse.Namespace) -> Iterator[Record]:
    """Wait for a quiet machine, read the facts, measure (the block), read the load again, write the JSON.
    Nothing is written when the block fails; exit status 1 when the run marked itself invalid."""

    def raise_on_sigterm(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_on_sigterm)
    began = time.monotonic()
    while load_1m() >= args.quiet_load and time.monotonic() - began < args.quiet_timeout:
        print(f"1-minute load average {load_1m():.2f} >= {args.quiet_load:g}; waiting", flush=True)
        time.sleep(10)
    facts = {**machine_facts(), "quiet_wait_s": round(time.monotonic() - began)}
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record = Record(name, " ".join([os.path.relpath(sys.executable, REPO), *sys.argv]), config, facts)
    yield record
    facts.update(load_1m_end=load_1m(), finished_at=now())
    output = args.output or REPO / "bench" / "results" / f"{name}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(asdict(record), indent=2) + "\n")
    for r in record.ratios:
        print(f"{r['figure']}: {r['value']:,.4g} against {r['peer']} {r['peer_value']:,.4g}: {r['ratio']:.3g}x")
    print(f"results written to {output}" + ("" if record.valid else " (marked INVALID: see its tables)"))
    if not record.valid:
        sys.exit(1)


# --------------------------------------------------------------------------- numbers and timing


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1] if ordered else math.nan


def ms(values: Sequence[float], *pcts: float, prefix: str = "") -> dict[str, float]:
    """Percentiles of durations in seconds, in milliseconds: {"p50_ms": ..., ...} (keys after `prefix`)."""
    return {f"{prefix}p{pct:g}_ms": percentile(values, pct) * 1000 for pct in pcts}


def timed(call: Callable[[], object], count: int, warmup: int = 0) -> list[float]:
    """Seconds of each of `count` calls, after `warmup` calls that are not timed."""
    durations = []
    for i in range(warmup + count):
        began = time.perf_counter()
        call()
        if i >= warmup:
            durations.append(time.perf_counter() - began)
    return durations


def spread(values: Iterable[float], median: str = "median", least: str = "min", most: str = "max") -> dict[str, float]:
    """The median, the minimum and the maximum of `values`, under these keys."""
    ordered = sorted(values)
    return {median: statistics.median(ordered), least: ordered[0], most: ordered[-1]}


def median(rows: Iterable[dict[str, Any]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def interleaved(
    paths: Sequence[str], warmup: int, runs: int, one: Callable[[str, int], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """`warmup` unmeasured then `runs` measured rounds, each running every path once, in turn:
    `one(path, n)` is a run's row, kept with the load average at its start."""
    kept: dict[str, list[dict[str, Any]]] = {path: [] for path in paths}
    for n in range(warmup + runs):
        for path in paths:
            load = load_1m()
            row = one(path, n)
            warm = {None: "", True: ", warm driver", False: ", cold driver"}[row.get("warm_driver")]
            said = ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k.endswith("_s") and isinstance(v, float))
            print(f"{path:<12} run {n + 1}: {said} (load {load:.2f}{warm})")
            if n >= warmup:
                kept[path].append({"load_1m_at_start": load, **row})
    return kept


def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 120.0, every_s: float = 0.5) -> None:
    """Poll `done` until it is true; TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout_s:.0f} s")
        time.sleep(every_s)


# --------------------------------------------------------------------------- a scratch database and the API


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> str:
    """Run the `trainmaster` console script; its stdout, or an error with its output."""
    done = subprocess.run([TRAINMASTER, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"trainmaster {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


@dataclass(frozen=True)
class Database:
    url: str
    token: str  # of project "bench"; empty when the database was not migrated by the CLI


@contextlib.contextmanager
def scratch_database(record: Record, admin_url: str, migrate: bool = True) -> Iterator[Database]:
    """A new database `tm_bench_<random>` on the server of `admin_url` (its version goes into the facts),
    with `migrate`: `trainmaster db upgrade` and a token of project "bench" from `trainmaster token create`.
    Dropped at the end."""
    admin_url = admin_url.replace("postgresql+psycopg://", "postgresql://", 1)
    name = f"tm_bench_{secrets.token_hex(4)}"

    def admin(statement: str) -> None:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(statement).format(sql.Identifier(name)))

    admin("CREATE DATABASE {}")
    try:
        print(f"database {name} created", flush=True)
        url = urlsplit(admin_url)._replace(path=f"/{name}").geturl()
        record.read_postgres(url)
        env, token = {**os.environ, "TRAINMASTER_DATABASE_URL": url}, ""
        if migrate:
            cli("db", "upgrade", env=env)
            token = cli("token", "create", "--project", "bench", env=env).split()[-1]
        yield Database(url, token)
    finally:
        admin("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        print(f"database {name} dropped", flush=True)


@dataclass(frozen=True)
class Api:
    url: str
    pid: int  # also its process group: uvicorn's workers are in it


@contextlib.contextmanager
def api_process(database_url: str, workers: int | None = 1) -> Iterator[Api]:
    """`trainmaster api` on a free loopback port, ready, in its own process group; stopped at the end.
    `workers` None: the API's own default."""
    port = free_port()
    command = [TRAINMASTER, "api", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", str(workers)] if workers is not None else []
    env = {**os.environ, "TRAINMASTER_DATABASE_URL": database_url}
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        api = Api(f"http://127.0.0.1:{port}", process.pid)

        def ready() -> bool:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"trainmaster api exited:\n{log.read()[-3000:].decode()}")
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"{api.url}/readyz", timeout=2).status_code == 200
            return False

        try:
            wait_until(ready, "trainmaster api not ready", 60, 0.2)
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


def submit_job(api_url: str, token: str) -> str:
    """A job submitted over HTTP; no dispatcher runs beside a bare API, so it stays queued."""
    body = {"name": "bench", "entrypoint": "builtin:mlp"}
    response = httpx.post(f"{api_url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return str(response.raise_for_status().json()["id"])


# --------------------------------------------------------------------------- a local stack, a bare Ray head


@dataclass(frozen=True)
class Stack:
    home: Path
    api_url: str
    token: str
    database_url: str
    ray_gcs: str
    shared: Path  # what jobs write and this process reads (see `folder`)

    def folder(self, name: str) -> Path:
        """A folder the jobs may write into whatever OS user runs their cluster (a stack started by root
        runs it as a user of its own, with umask 077: api/stack/osusers.py); removed with the stack."""
        path = self.shared / name
        path.mkdir()
        path.chmod(0o1777)
        return path

    def job_code(self, *files: str) -> Path:
        """A working_dir holding only these files of bench/."""
        folder = self.home / "job-code"
        folder.mkdir(exist_ok=True)
        for name in files:
            shutil.copy2(REPO / "bench" / name, folder)
        return folder

    def client(self) -> tm.Client:
        return tm.Client(api_url=self.api_url, token=self.token)

    def wait_idle(self, client: tm.Client) -> None:
        """Wait until every Ray CPU is free again (the previous job's gang released), as GET /v1/cluster says."""

        def idle() -> bool:
            info = client.cluster()
            return bool(info.reachable and info.total.get("CPU") and info.free.get("CPU") == info.total.get("CPU"))

        wait_until(idle, "Ray CPUs still in use")


@contextlib.contextmanager
def local_stack(record: Record, nodes: int = 1) -> Iterator[Stack]:
    """`trainmaster up --api-port 0` in a fresh TRAINMASTER_HOME (its PostgreSQL's version goes into the
    facts); `trainmaster down` at the end. The home is removed unless the block failed (its logs/ stay)."""
    home = Path(tempfile.mkdtemp(prefix="tm-bench-"))
    shared = Path(tempfile.mkdtemp(prefix="tm-bench-jobs-"))
    shared.chmod(0o711)  # passable, not listable
    unset = ("TRAINMASTER_DATABASE_URL", "TRAINMASTER_API_URL", "TRAINMASTER_TOKEN", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in unset} | {"TRAINMASTER_HOME": str(home)}
    failed = True
    try:
        print(f"starting a stack in {home}", flush=True)
        cli("up", "--api-port", "0", "--nodes", str(nodes), env=env, timeout=600)
        config = json.loads((home / "config").read_text())  # the SDK's config file
        state = json.loads((home / "stack.json").read_text())  # the stack's own record of its addresses
        record.read_postgres(state["database_url"])
        yield Stack(home, config["api_url"], config["token"], state["database_url"], state["ray_gcs"], shared)
        failed = False
    finally:
        print("stopping the stack", flush=True)
        try:
            cli("down", env=env, timeout=300)
        except (RuntimeError, subprocess.SubprocessError) as exc:
            print(f"WARNING: {exc}", file=sys.stderr)
            failed = True
        shutil.rmtree(shared, ignore_errors=True)
        if failed:
            print(f"the stack's logs are kept in {home / 'logs'}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def ray_head(num_cpus: int) -> Iterator[Any]:
    """A Ray head started the way the project starts one (`api.stack.ray_head`, token auth on loopback),
    in a temporary folder; stopped and removed at the end. Yields its `RayHead`."""
    from api.stack import ray_head as heads

    temp = Path(tempfile.mkdtemp(prefix="tmb-", dir="/tmp"))  # short: Ray keeps Unix sockets under it
    head = None
    try:
        head = heads.start(temp / "ray", temp / "token", num_cpus=num_cpus, log_path=temp / "ray.log")
        yield head
    finally:
        if head is not None:
            heads.stop(head.temp_dir, head.gcs_address)
        shutil.rmtree(temp, ignore_errors=True)
