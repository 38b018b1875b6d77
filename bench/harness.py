"""What every script in bench/ shares: options, the run record with the machine's facts (written as
JSON for bench/report.py), the stack under measurement, timing and percentiles.

The processes themselves (the API, Ray heads and nodes, `stop`) are started by
tests/factories/processes.py, the module the end-to-end tests use: a benchmark measures what the tests
check. A script measures inside `with run(name, args) as record:`, filling `record.tables` (lists of
rows) and `record.ratios`; on a clean exit the record goes to bench/results/<name>.json. SIGTERM and
Ctrl-C go through every `finally` (processes, databases, stacks); a failed run writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
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
from typing import TYPE_CHECKING, Any

import httpx
import psycopg

import trainmaster as tm

if TYPE_CHECKING:  # the rest is imported where used: client processes spawned by bench/clients.py
    # import the script again, and should start in a moment even on a loaded machine
    from api.stack.ray_head import RayHead
    from tests.factories.processes import ApiProcess

REPO = Path(__file__).resolve().parents[1]

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
        extra = more[0] if more else {}
        kind: dict[str, Any] = {"type": type(default)}
        if isinstance(default, list):
            kind = {"type": type(default[0]), "nargs": "+"}
        if default is False or "action" in extra:
            kind = {"action": "store_true"}
        p.add_argument(flag, default=default, help=help_text, **(kind | extra))
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
    versions = {name: version(name) for name in ("torch", "ray")}
    return {"cpus": os.cpu_count(), "load_1m_start": load_1m(), "platform": platform.platform(),
            "python": platform.python_version(), **versions, "postgresql": None, "git": commit,
            "started_at": now()}  # fmt: skip


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
        """A figure against its peer's, as `value / peer_value` (NaN for a peer that measured nothing)."""
        row = {"figure": figure, "value": value, "peer": peer, "peer_value": peer_value}
        self.ratios.append(row | {"ratio": value / peer_value if peer_value else math.nan})

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
    output.write_text(json.dumps(asdict(record), indent=2, default=str) + "\n")
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
    """`warmup` unmeasured then `runs` measured rounds, each running every path once, in turn (a path
    and its peer minutes apart share this machine's drift): `one(path, n)` is a run's row, kept with the
    load average at its start."""
    kept: dict[str, list[dict[str, Any]]] = {path: [] for path in paths}
    for n in range(warmup + runs):
        for path in paths:
            load = load_1m()
            row = one(path, n)
            said = ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k.endswith("_s") and isinstance(v, float))
            print(f"{path:<12} run {n + 1}: {said} (load {load:.2f})", flush=True)
            if n >= warmup:
                kept[path].append({"load_1m_at_start": load, **row})
    return kept


# --------------------------------------------------------------------------- a scratch database and the API


@contextlib.contextmanager
def scratch_database(record: Record, server_url: str) -> Iterator[str]:
    """A new database `tm_bench_<random>` on the server of `server_url` (its version goes into the facts),
    migrated with Alembic; dropped at the end. Yields its URL."""
    from api.db import migrate
    from api.stack.postgres import create_database, drop_database

    url = create_database(server_url, "tm_bench")
    try:
        print(f"database {url.rsplit('/', 1)[-1]} created", flush=True)
        record.read_postgres(url)
        migrate.upgrade(url)
        yield url
    finally:
        drop_database(server_url, url)


@contextlib.contextmanager
def api_process(database_url: str, workers: int | None = 1) -> Iterator[ApiProcess]:
    """`trainmaster api` (tests/factories/processes.py) with a token of project "bench"; stopped at the
    end. `workers` None: the API's own default."""
    from tests.factories.processes import start_api, stop

    with tempfile.TemporaryDirectory(prefix="tmb-api-") as logs:
        api = start_api(database_url, Path(logs) / "api.log", ready_s=60, workers=workers, project="bench")
        try:
            yield api
        finally:
            stop(api.process, grace_s=15)


def submit_job(api: ApiProcess) -> str:
    """A job submitted over HTTP; no dispatcher runs beside a bare API, so it stays queued."""
    body = {"name": "bench", "entrypoint": "builtin:mlp"}
    response = httpx.post(f"{api.url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {api.token}"}, timeout=30)
    return str(response.raise_for_status().json()["id"])


# --------------------------------------------------------------------------- a local stack (`trainmaster up`)


@dataclass(frozen=True)
class Stack:
    home: Path
    api_url: str
    token: str
    database_url: str
    head: RayHead
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
            (folder / name).write_bytes((REPO / "bench" / name).read_bytes())
        return folder

    def client(self) -> tm.Client:
        return tm.Client(api_url=self.api_url, token=self.token)

    def wait_idle(self, client: tm.Client) -> None:
        """Wait until every Ray CPU is free again (the previous job's gang released), as GET /v1/cluster says."""
        from tests.factories.processes import wait_until

        def idle() -> bool:
            info = client.cluster()
            return bool(info.reachable and info.total.get("CPU") and info.free.get("CPU") == info.total.get("CPU"))

        wait_until(idle, 120, 0.5, "Ray CPUs to be free")


@contextlib.contextmanager
def local_stack(record: Record, nodes: int = 1) -> Iterator[Stack]:
    """`trainmaster up --api-port 0` in a fresh TRAINMASTER_HOME (its PostgreSQL's version goes into the
    facts); `trainmaster down` at the end. The home is removed unless the block failed (its logs/ stay)."""
    from api.stack.ray_head import RayHead
    from tests.factories.processes import run_cli
    home = Path(tempfile.mkdtemp(prefix="tm-bench-"))
    shared = Path(tempfile.mkdtemp(prefix="tm-bench-jobs-"))
    shared.chmod(0o711)  # passable, not listable
    unset = ("TRAINMASTER_DATABASE_URL", "TRAINMASTER_API_URL", "TRAINMASTER_TOKEN", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in unset} | {"TRAINMASTER_HOME": str(home)}
    failed = True
    try:
        print(f"starting a stack in {home}", flush=True)
        run_cli("up", "--api-port", "0", "--nodes", str(nodes), env=env, timeout=600)
        config = json.loads((home / "config").read_text())  # the SDK's config file
        state = json.loads((home / "stack.json").read_text())  # the stack's own record of its addresses
        record.read_postgres(state["database_url"])
        head = RayHead(state["ray_dashboard"], state["ray_gcs"], home / "ray_auth_token", Path(state["ray_temp_dir"]))
        yield Stack(home, config["api_url"], config["token"], state["database_url"], head, shared)
        failed = False
    finally:
        print("stopping the stack", flush=True)
        try:
            run_cli("down", env=env, timeout=300)
        except (RuntimeError, subprocess.SubprocessError) as exc:
            print(f"WARNING: {exc}", file=sys.stderr)
            failed = True
        shutil.rmtree(shared, ignore_errors=True)
        if failed:
            print(f"the stack's logs are kept in {home / 'logs'}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
