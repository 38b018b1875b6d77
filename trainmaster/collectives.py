"""What the collectives benchmark measures and how its results are written: no torch needed.

Sizes and bandwidths follow nccl-tests (doc/PERFORMANCE.md): the size of a row is the larger
buffer of the operation (all_gather: the gathered output, reduce_scatter: the input), algbw is
size / time in GB/s (1e9 bytes), and busbw = algbw * factor, the factor being 2(n-1)/n for
all_reduce, (n-1)/n for all_gather and reduce_scatter, and 1 for broadcast.

Each row becomes one metric point at step = its index, with values named
``coll/<backend>/<op>/<mode>/<field>`` for the fields in `FIELDS`; `trainmaster bench
collectives` rebuilds the table from those names (`rows_from_points`). Shared by the job
(`workers.collectives`) and the CLI, so both read the same plan.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from typing import Any

from trainmaster.models import MetricValue

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
MODES = ("out", "in")  # out-of-place, then in-place, as nccl-tests prints them
FIELDS = ("size_bytes", "count", "time_us", "algbw", "busbw", "wrong")
METRIC_PREFIX = "coll"
DTYPE = "float"
ELEMENT_BYTES = 4
MIN_SIZE = 8
MAX_SIZE = 64 * 1024 * 1024
EVENT_LIMIT = 14 * 1024  # the API takes 16 KiB of event data; leave room for the envelope


def bus_factor(op: str, world_size: int) -> float:
    """busbw / algbw: the share of the data each rank's link carries, as nccl-tests defines it."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; choose from {', '.join(OPS)}")


def bandwidths(op: str, size_bytes: int, time_us: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for `size_bytes` moved in `time_us` microseconds."""
    if time_us <= 0:
        return 0.0, 0.0
    algbw = size_bytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * bus_factor(op, world_size)


def doubling_sizes(min_size: int = MIN_SIZE, max_size: int = MAX_SIZE) -> list[int]:
    """min_size, 2·min_size, … up to max_size (inclusive), like nccl-tests' `-b 8 -e 64M -f 2`."""
    if min_size < 1 or max_size < min_size:
        raise ValueError(f"sizes must satisfy 1 <= min_size <= max_size (got {min_size}, {max_size})")
    sizes, size = [], min_size
    while size <= max_size:
        sizes.append(size)
        size *= 2
    return sizes


def element_count(op: str, size_bytes: int, world_size: int) -> int:
    """Elements of the row's buffer; a multiple of the world size where the op splits it per rank."""
    count = max(1, size_bytes // ELEMENT_BYTES)
    if op in ("all_gather", "reduce_scatter"):
        count = max(1, count // world_size) * world_size
    return count


@dataclass(frozen=True)
class Row:
    """One line of the table: an operation at one size, mode and backend, averaged over ranks."""

    backend: str
    op: str
    mode: str
    size_bytes: int
    count: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int

    def metric_values(self) -> dict[str, float]:
        prefix = metric_prefix(self.backend, self.op, self.mode)
        return {f"{prefix}/{name}": float(getattr(self, name)) for name in FIELDS}


def metric_prefix(backend: str, op: str, mode: str) -> str:
    for part in (backend, op, mode):
        if not part or "/" in part:
            raise ValueError(f"metric name part {part!r} must be non-empty and free of '/'")
    return f"{METRIC_PREFIX}/{backend}/{op}/{mode}"


COLUMNS = [f.name for f in fields(Row)]


def result_events(rows: Sequence[Row], summary: dict[str, Any], limit: int = EVENT_LIMIT) -> list[dict[str, Any]]:
    """The table as event data parts of at most `limit` bytes of JSON: columns once, rows as lists.

    Every part carries `part`, `parts` and `columns`; the first also carries `summary`.
    """
    parts: list[list[list[Any]]] = [[]]
    base = len(json.dumps({"columns": COLUMNS, "rows": [], "part": 999, "parts": 999, "summary": summary}))
    used = base
    for row in rows:
        encoded = [_compact(v) for v in astuple(row)]
        cost = len(json.dumps(encoded)) + 2
        if parts[-1] and used + cost > limit:
            parts.append([])
            used = base
        parts[-1].append(encoded)
        used += cost
    events = [{"columns": COLUMNS, "rows": chunk, "part": i + 1, "parts": len(parts)} for i, chunk in enumerate(parts)]
    events[0]["summary"] = summary
    return events


def rows_from_events(datas: Iterable[dict[str, Any]]) -> list[Row]:
    """Rebuild rows from `collectives_result` event data (any order of parts)."""
    ordered = sorted(datas, key=lambda d: int(d.get("part", 1)))
    return [Row(**dict(zip(d["columns"], values, strict=True))) for d in ordered for values in d["rows"]]


@dataclass(frozen=True)
class PointRow(Row):
    """A row rebuilt from the job's metric points, with the step it was logged at."""

    step: int = 0


def rows_from_points(points: Iterable[MetricValue]) -> list[PointRow]:
    """Rows from rank 0's `coll/...` metric points, by step; incomplete rows are left out."""
    found: dict[int, tuple[tuple[str, str, str], dict[str, float]]] = {}
    for point in points:
        parts = point.name.split("/")
        if point.rank != 0 or point.step is None or len(parts) != 5:
            continue
        if parts[0] != METRIC_PREFIX or parts[4] not in FIELDS:
            continue
        key = (parts[1], parts[2], parts[3])
        found.setdefault(point.step, (key, {}))[1][parts[4]] = float("nan") if point.value is None else point.value
    rows = []
    for step in sorted(found):
        (backend, op, mode), values = found[step]
        if set(values) == set(FIELDS):
            size, count, time_us, algbw, busbw, wrong = (values[name] for name in FIELDS)
            rows.append(PointRow(backend, op, mode, int(size), int(count), time_us, algbw, busbw, int(wrong), step))
    return rows


def average_busbw(rows: Iterable[Row]) -> dict[str, dict[str, float]]:
    """Mean busbw per backend, per op and over all its rows ("all"), like nccl-tests' last line."""
    sums: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        per_op = sums.setdefault(row.backend, {})
        per_op.setdefault(row.op, []).append(row.busbw)
        per_op.setdefault("all", []).append(row.busbw)
    return {b: {op: sum(v) / len(v) for op, v in per_op.items()} for b, per_op in sums.items()}


def _compact(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


BACKEND_ALIASES = {"torch": "torch", "nccl": "torch", "gloo": "torch", "grpc": "grpc"}
CONFIG_KEYS = {"backends", "ops", "min_size", "max_size", "warmup", "iters", "grpc_timeout_s"}


@dataclass(frozen=True)
class BenchConfig:
    """The job's config. "torch" (or its spellings "nccl" and "gloo") is the job's process group."""

    backends: tuple[str, ...] = ("torch", "grpc")
    ops: tuple[str, ...] = OPS
    min_size: int = MIN_SIZE
    max_size: int = MAX_SIZE
    warmup: int = 5
    iters: int = 20
    grpc_timeout_s: float = 600.0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BenchConfig:
        unknown = set(config) - CONFIG_KEYS
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
        backends: list[str] = []
        for name in config.get("backends", cls.backends):
            if name not in BACKEND_ALIASES:
                raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKEND_ALIASES)}")
            if BACKEND_ALIASES[name] not in backends:
                backends.append(BACKEND_ALIASES[name])
        ops = tuple(config.get("ops", OPS))
        for op in ops:
            bus_factor(op, 2)  # raises for an unknown op
        bench = cls(
            backends=tuple(backends),
            ops=ops,
            min_size=int(config.get("min_size", MIN_SIZE)),
            max_size=int(config.get("max_size", MAX_SIZE)),
            warmup=int(config.get("warmup", 5)),
            iters=int(config.get("iters", 20)),
            grpc_timeout_s=float(config.get("grpc_timeout_s", 600.0)),
        )
        if not bench.backends or not bench.ops:
            raise ValueError("give at least one backend and one op")
        if bench.warmup < 0 or bench.iters < 1:
            raise ValueError("warmup must be >= 0 and iters >= 1")
        doubling_sizes(bench.min_size, bench.max_size)  # raises for bad bounds
        return bench

    def sizes(self) -> list[int]:
        return doubling_sizes(self.min_size, self.max_size)

    def total_rows(self) -> int:
        return len(self.backends) * len(self.ops) * len(self.sizes()) * len(MODES)
