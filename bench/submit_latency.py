"""Time from submit to the first training step on a warm cluster, against a direct `TorchTrainer.fit()`.

What it measures
    The script starts its own local platform (`trainmaster up --api-port 0` in a fresh temporary
    TRAINMASTER_HOME: embedded PostgreSQL, a Ray head with token auth, the API and a dispatcher) and
    runs the same 2-worker function, `bench/first_step_job.py:train_loop_per_worker`, two ways:

    platform  `client.submit(entrypoint="first_step_job:train_loop_per_worker", working_dir=<a folder
              holding only first_step_job.py>, scaling=Scaling(num_workers=2), config={"stamp_path"})`;
              t0 is taken just before `submit` (so the code upload and the POST are included), then
              the job is awaited until it succeeds.
    direct    in this process: `ray.init(address=<the stack's GCS>, runtime_env={"working_dir": <the
              same folder>})` with the Ray token, then t0, `TorchTrainer(...)` (ScalingConfig(2),
              RunConfig(storage_path=<temp dir>)) and `fit()`, then `ray.shutdown()`. Connecting is
              timed apart and not counted: a new Ray job per run, like the platform's, but the
              driver (this process) is already up with torch and Ray imported.

    The figure is "first step" minus t0, where "first step" is the wall-clock time rank 0 appends to
    `stamp_path` just before its first training step. One warm-up run of each path, then `--runs`
    measured runs of each, interleaved (platform, direct, platform, ...). Before each run the script
    waits until the Ray cluster has no CPU in use (the previous run's gang is gone); before the
    measured runs it waits up to 5 minutes for the 1-minute load average to drop below 1.5.
    For the platform it also reads the job's events (queued, admitted = starting, seen running by the
    dispatcher, rank 0's `runtime` event posted just before the user function, succeeded) and, from
    the Ray dashboard, when the Ray Jobs API accepted the submission and when the job's driver
    process (`python -m workers.driver`) connected to Ray; all relative to t0.

Run it from the repository root (the stack is stopped at the end, on errors and Ctrl-C too):

    .venv/bin/python bench/submit_latency.py [--runs 5] [--warmup 1]

Results go to bench/results/submit_latency.json and a README section to bench/results/submit_latency.md.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from common import (
    REPO,
    RESULTS,
    Stack,
    in_temp_home,
    load_1m,
    md_table,
    prepare_home,
    raise_on_sigterm,
    run_main,
    run_metadata,
    running_stack,
    text_table,
    wait_cluster_idle,
    wait_for_quiet_stack,
    write_results,
)

JOB_FILE = REPO / "bench" / "first_step_job.py"
ENTRYPOINT = "first_step_job:train_loop_per_worker"
NAME = "submit_latency"
PLATFORM, DIRECT = "platform", "direct"
EVENT_MARKS = ("queued", "starting", "running", "runtime", "succeeded")  # status values, or event kinds

# --------------------------------------------------------------------------- configuration


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="measured runs of each path (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each path first (default 1)")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (default 2)")
    parser.add_argument("--job-timeout", type=float, default=300.0, help="seconds one run may take")
    parser.add_argument("--quiet-load", type=float, default=1.5, help="1-minute load to wait for before measuring")
    parser.add_argument("--quiet-wait", type=float, default=300.0, help="longest wait for that load, seconds")
    parser.add_argument("--output", type=Path, default=RESULTS / f"{NAME}.json", help="JSON results file")
    parser.add_argument("--markdown", type=Path, default=RESULTS / f"{NAME}.md", help="README section file")
    parser.add_argument("--keep-home", action="store_true", help="keep the temporary TRAINMASTER_HOME (logs)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or args.workers < 1:
        parser.error("--runs and --workers must be >= 1, --warmup >= 0")
    return args


# --------------------------------------------------------------------------- the two paths


def read_stamp(path: Path) -> float:
    lines = path.read_text().split() if path.exists() else []
    if len(lines) != 1:
        raise RuntimeError(f"{path}: expected one first-step stamp, found {len(lines)}")
    return float(lines[0])


def event_offsets(events: Sequence[Any], t0: float) -> dict[str, float]:
    """Seconds from t0 to the first event of each mark: a status value, or the event kind `runtime`."""
    offsets: dict[str, float] = {}
    for event in events:
        mark = event.status.value if event.kind == "status" and event.status is not None else event.kind
        if mark in EVENT_MARKS and mark not in offsets:
            offsets[mark] = event.created_at.timestamp() - t0
    return offsets


def ray_get(stack: Stack, path: str, **params: Any) -> Any:
    response = httpx.get(f"{stack.ray_dashboard}{path}", params=params, headers=stack.ray_headers(), timeout=30)
    response.raise_for_status()
    return response.json()


def ray_offsets(stack: Stack, submission_id: str, t0: float) -> dict[str, float]:
    """From Ray's side, seconds from t0 to: the Jobs API accepting the submission (`ray_accepted`) and
    the job's driver process (`python -m workers.driver`) connecting to Ray (`driver_connected`).
    Best effort: empty where the dashboard does not say."""
    try:
        job = ray_get(stack, f"/api/jobs/{submission_id}")
        out = {"ray_accepted": job["start_time"] / 1000 - t0}
        pid = (job.get("driver_info") or {}).get("pid")
        if pid:
            listing = ray_get(
                stack, "/api/v0/workers", detail="true", filter_keys="pid", filter_predicates="=", filter_values=pid
            )
            drivers = [w for w in listing["data"]["result"]["result"] if w["worker_type"] == "DRIVER"]
            if drivers and drivers[0].get("start_time_ms"):
                out["driver_connected"] = drivers[0]["start_time_ms"] / 1000 - t0
        return out
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        print(f"  (no Ray timeline for {submission_id}: {exc})", flush=True)
        return {}


def platform_run(
    client: Any, stack: Stack, workdir: Path, stamp: Path, label: str, args: argparse.Namespace
) -> dict[str, Any]:
    import trainmaster as tm
    from trainmaster.errors import WaitTimeout

    t0 = time.time()
    job = client.submit(
        name=f"bench-first-step-{label}",
        entrypoint=ENTRYPOINT,
        working_dir=workdir,
        scaling=tm.Scaling(num_workers=args.workers),
        config={"stamp_path": str(stamp)},
    )
    submitted = time.time()
    try:
        info = job.wait(timeout=args.job_timeout, poll_interval=0.25)
    except WaitTimeout:
        client.cancel(job.id)
        raise
    done = time.time()
    first = read_stamp(stamp)
    events = event_offsets(client.events(job.id), t0)
    events.update(ray_offsets(stack, info.attempts[-1].ray_submission_id, t0))
    return {
        "job_id": job.id,
        "first_step_s": first - t0,
        "submit_call_s": submitted - t0,
        "observed_done_s": done - t0,
        "events_s": events,
    }


def direct_run(stack: Stack, workdir: Path, storage: Path, stamp: Path, label: str, workers: int) -> dict[str, Any]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    job_module = importlib.import_module("first_step_job")  # from `workdir`, which use_stack put on sys.path

    began = time.time()
    ray.init(
        address=stack.ray_gcs,
        runtime_env={"working_dir": str(workdir)},
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    connected = time.time()
    try:
        t0 = time.time()
        trainer = TorchTrainer(
            train_loop_per_worker=job_module.train_loop_per_worker,
            train_loop_config={"stamp_path": str(stamp)},
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(name=f"bench-first-step-{label}-{uuid.uuid4().hex[:8]}", storage_path=str(storage)),
        )
        result = trainer.fit()
        done = time.time()
    finally:
        ray.shutdown()
    if result.error is not None:
        raise RuntimeError(f"direct run {label} failed: {result.error}")
    return {"first_step_s": read_stamp(stamp) - t0, "connect_s": connected - began, "fit_returned_s": done - t0}


# --------------------------------------------------------------------------- the schedule


@dataclass
class Bench:
    args: argparse.Namespace
    stack: Stack
    client: Any
    workdir: Path
    storage: Path
    stamps: Path

    def run(self, path: str, label: str) -> dict[str, Any]:
        idle_wait = wait_cluster_idle(self.stack)
        load = load_1m()
        stamp = self.stamps / f"{path}-{label}.txt"
        if path == PLATFORM:
            record = platform_run(self.client, self.stack, self.workdir, stamp, label, self.args)
        else:
            record = direct_run(self.stack, self.workdir, self.storage, stamp, label, self.args.workers)
        record.update({"label": label, "load_1m_at_start": load, "idle_wait_s": idle_wait})
        print(
            f"  {path:<8} {label:<9} first step after {record['first_step_s']:6.2f} s   (load {load:.2f})", flush=True
        )
        return record

    def schedule(self) -> dict[str, Any]:
        warmup: dict[str, list[dict[str, Any]]] = {PLATFORM: [], DIRECT: []}
        runs: dict[str, list[dict[str, Any]]] = {PLATFORM: [], DIRECT: []}
        print(f"warm-up: {self.args.warmup} run(s) of each path", flush=True)
        for n in range(self.args.warmup):
            for path in (PLATFORM, DIRECT):
                warmup[path].append(self.run(path, f"warmup-{n + 1}"))
        print("waiting for a quiet machine before the measured runs", flush=True)
        quiet = wait_for_quiet_stack(self.args.quiet_load, self.args.quiet_wait)
        print(f"measured: {self.args.runs} run(s) of each path, interleaved", flush=True)
        for n in range(self.args.runs):
            for path in (PLATFORM, DIRECT):
                runs[path].append(self.run(path, f"run-{n + 1}"))
        return {"warmup": warmup, "runs": runs, "quiet_wait": quiet}


# --------------------------------------------------------------------------- statistics and report


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, records in runs.items():
        values = [r["first_step_s"] for r in records]
        out[path] = {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}
    out["ratio_platform_over_direct"] = out[PLATFORM]["median_s"] / out[DIRECT]["median_s"]
    marks: dict[str, list[float]] = {}
    for record in runs[PLATFORM]:
        for mark, offset in record["events_s"].items():
            marks.setdefault(mark, []).append(offset)
    marks["first_step"] = [r["first_step_s"] for r in runs[PLATFORM]]
    marks["submit_call"] = [r["submit_call_s"] for r in runs[PLATFORM]]
    out["platform_marks_median_s"] = {mark: statistics.median(v) for mark, v in marks.items()}
    out["direct_connect_median_s"] = statistics.median(r["connect_s"] for r in runs[DIRECT])
    return out


PHASES = (
    ("submit_call", "t0 → submit returned (code upload + POST /v1/jobs)"),
    ("starting", "→ admitted by the dispatcher (event `starting`)"),
    ("ray_accepted", "→ accepted by the Ray Jobs API (job start_time)"),
    ("driver_connected", "→ job driver process connected to Ray (DRIVER worker start)"),
    ("runtime", "→ rank 0 up, process group ready (event `runtime`)"),
    ("first_step", "→ first step"),
)


def phases(marks: dict[str, float]) -> list[tuple[str, float]]:
    """Median offsets from t0 turned into consecutive phases of the platform path. The `running`
    event is left out: the dispatcher notices it on its next reconcile poll, not when it happens."""
    out, previous = [], 0.0
    for mark, text in PHASES:
        if mark in marks:
            out.append((text, marks[mark] - previous))
            previous = marks[mark]
    return out


def runs_table(runs: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    nan = float("nan")
    rows = []
    for n, (p, d) in enumerate(zip(runs[PLATFORM], runs[DIRECT], strict=True), start=1):
        ev = p["events_s"]
        rows.append(
            [
                str(n),
                f"{p['first_step_s']:.2f}",
                f"{d['first_step_s']:.2f}",
                f"{ev.get('starting', nan) - ev.get('queued', 0.0):.2f}",
                f"{ev.get('driver_connected', nan) - ev.get('starting', nan):.2f}",
                f"{p['first_step_s'] - ev.get('driver_connected', nan):.2f}",
                f"{p['load_1m_at_start']:.2f} / {d['load_1m_at_start']:.2f}",
            ]
        )
    return rows


RUN_HEADER = [
    "run",
    "platform s",
    "direct s",
    "p: queued→admitted s",
    "p: admitted→driver connected s",
    "p: driver connected→first step s",
    "load 1m (p / d)",
]


def summary_rows(s: dict[str, Any]) -> list[list[str]]:
    return [
        [path, f"{s[path]['median_s']:.2f}", f"{s[path]['min_s']:.2f}", f"{s[path]['max_s']:.2f}"]
        for path in (PLATFORM, DIRECT)
    ]


def interpretation(s: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> str:
    p, d = s[PLATFORM]["median_s"], s[DIRECT]["median_s"]
    peak, cpus = max(r["load_1m_at_start"] for records in runs.values() for r in records), os.cpu_count() or 1
    busy = peak > 2 * cpus  # one run of ours alone keeps the load near cpus
    text = (
        f"On a warm cluster the platform reaches the first step {p - d:.1f} s later than a direct "
        f"`TorchTrainer.fit()` ({p:.1f} s vs {d:.1f} s median, {p / d:.2f}x"
        f"{f'; 1-minute load up to {peak:.1f} on {cpus} cores, so absolute times are inflated' if busy else ''})"
    )
    driver = s["platform_marks_median_s"].get("driver_connected")
    if driver is None:
        return text + "."
    return (
        f"{text}; {driver:.1f} s (median) pass before the job's Ray driver process is connected (submit, "
        f"admission, Ray Jobs API, driver start), then {p - driver:.1f} s to the first step (direct: {d:.1f} s)."
    )


def markdown(results: dict[str, Any]) -> str:
    s, load, quiet = results["summary"], results["loadavg_1m"], results["quiet_wait"]
    phase_rows = [[text, f"{seconds:.2f}"] for text, seconds in phases(s["platform_marks_median_s"])]
    return "\n".join(
        [
            "## Submit to first training step (platform vs direct `TorchTrainer.fit()`)",
            "",
            "```",
            f".venv/bin/python {results['command'].split(' ', 1)[1]}    # defaults: --runs 5 --warmup 1 --workers 2",
            "```",
            "",
            "Same 2-worker gloo function (`bench/first_step_job.py`) on the script's own `trainmaster up` stack: "
            "through `client.submit(working_dir=...)` (t0 before submit) and as `TorchTrainer.fit()` in an "
            "already-connected driver (t0 before constructing the trainer; `ray.init` not counted, "
            f"{s['direct_connect_median_s']:.2f} s median). First step = rank 0's wall clock just before its "
            "first step. One warm-up each, then runs interleaved; before each run the cluster's CPUs are idle.",
            "",
            f"**Machine.** {results['machine']['cpus']} shared cores (another engineer's tests ran concurrently); "
            f"Python {results['machine']['python']}; git `{results['git']}`; {results['measured_at']}. "
            f"1-minute load average: {load['start']:.2f} at the start, {load['before_measured']:.2f} before the "
            f"measured runs (waited {quiet['waited_s']:.0f} s for < {quiet['threshold']}"
            f"{'' if quiet['quiet'] else ', not reached'}), {load['end']:.2f} at the end.",
            "",
            md_table(RUN_HEADER, runs_table(results["runs"])),
            "",
            md_table(["path", "median s", "min s", "max s"], summary_rows(s)),
            "",
            f"Ratio platform / direct of the medians: **{s['ratio_platform_over_direct']:.2f}x**.",
            "",
            "Platform phases (medians of the event offsets from t0):",
            "",
            md_table(["phase", "s"], phase_rows),
            "",
            interpretation(s, results["runs"]),
            "",
        ]
    )


def report(args: argparse.Namespace, measured: dict[str, Any], loadavg: dict[str, float]) -> dict[str, Any]:
    s = summary(measured["runs"])
    results = {
        **run_metadata(NAME, args, loadavg, python=Path(sys.executable).name, short_git=True),
        **measured,
        "summary": s,
    }
    print()
    print(text_table(RUN_HEADER, runs_table(measured["runs"])))
    print()
    print(text_table(["path", "median s", "min s", "max s"], summary_rows(s)))
    print(f"ratio platform / direct of the medians: {s['ratio_platform_over_direct']:.2f}x")
    print()
    print(
        text_table(
            ["platform phase (medians)", "s"], [[t, f"{v:.2f}"] for t, v in phases(s["platform_marks_median_s"])]
        )
    )
    print("1-minute load average: " + ", ".join(f"{k} {v:.2f}" for k, v in loadavg.items()))
    print(interpretation(s, measured["runs"]))
    return results


# --------------------------------------------------------------------------- main


def use_stack(stack: Stack, workdir: Path) -> Callable[[], None]:
    """Point this process at the stack (Ray token, no RAY_ADDRESS); returns the undo."""
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(stack.ray_token_path)})
    os.environ.pop("RAY_ADDRESS", None)
    sys.path.insert(0, str(workdir))

    def undo() -> None:
        sys.path.remove(str(workdir))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    return undo


def run_benchmark(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    import trainmaster as tm

    loadavg = {"start": load_1m()}
    workdir, storage, stamps = prepare_home(home, JOB_FILE, "direct-storage", "stamps")
    with running_stack(home) as stack:
        print(f"stack up: api {stack.api_url}, ray {stack.ray_gcs}", flush=True)
        undo = use_stack(stack, workdir)
        try:
            with tm.Client(api_url=stack.api_url, token=stack.token) as client:
                bench = Bench(args, stack, client, workdir, storage, stamps)
                measured = bench.schedule()
        finally:
            undo()
        loadavg["before_measured"] = measured["quiet_wait"]["load_last"]
        loadavg["end"] = load_1m()
    return report(args, measured, loadavg)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    results = in_temp_home("tm-bench-submit-", args.keep_home, lambda home: run_benchmark(args, home))
    write_results(results, args.output, (args.markdown, markdown(results)))
    return 0


if __name__ == "__main__":
    run_main(main, "the stack was stopped")
