"""Steps/s of one 2-worker gloo loop: no logging, `trainmaster.log` every step, `ray.train.report` every step.

Target: logging every step with `trainmaster.log` keeps >= 0.97x the steps/s of no logging.

What it measures
    The script starts its own local platform (`trainmaster up --api-port 0` in a fresh temporary
    TRAINMASTER_HOME) and submits, through the SDK, jobs running `bench/step_loop_job.py` (function
    entrypoint `step_loop_job:train_loop_per_worker`, that file alone as working_dir) on 2 workers.
    Each worker trains a small MLP under DDP (gloo all-reduce every step) on one fixed batch; after
    `--warmup-steps` unmeasured steps and a barrier, rank 0 times `--steps` steps with
    `time.perf_counter()` (setup, warm-up and the final flush excluded) and writes steps/s to a file.
    The modes differ only by the call after each step:

    none          nothing (`loss.item()` is still called, as in the other modes)
    trainmaster   `trainmaster.log({"loss": ...}, step=i)`: the platform's metrics path (buffered,
                  sent by a background thread to the API, which stores it in PostgreSQL)
    ray_report    `ray.train.report({"loss": ..., "step": i})`: Ray Train's reporting, a barrier with
                  the controller; far fewer steps (`--report-steps`), as each call takes ~seconds

    After a warm-up job, `--reps` repetitions of none/trainmaster alternate (none first in odd
    repetitions, trainmaster first in even ones), with `--report-runs` ray_report jobs after the
    first and last repetitions. Before each job the script waits until the Ray cluster has no CPU
    in use; before the measured jobs it waits up to 5 minutes for the 1-minute load average to drop
    below 1.5. It checks that every trainmaster point arrived (GET /v1/jobs/{id}/metrics?name=loss,
    paged: warm-up + measured steps on each rank) and records the CPU seconds the API and PostgreSQL
    processes used during each job: on this machine they share the cores with the workers.

Run it from the repository root (the stack is stopped at the end, on errors and Ctrl-C too):

    .venv/bin/python bench/logging_overhead.py [--reps 3] [--steps 2000] [--report-runs 2]

Results go to bench/results/logging_overhead.json and a README section to bench/results/logging_overhead.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
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

JOB_FILE = REPO / "bench" / "step_loop_job.py"
ENTRYPOINT = "step_loop_job:train_loop_per_worker"
NAME = "logging_overhead"
NONE, TRAINMASTER_LOG, RAY_REPORT = "none", "trainmaster", "ray_report"
MODES = (NONE, TRAINMASTER_LOG, RAY_REPORT)
TARGET_RATIO = 0.97
CLK_TCK = os.sysconf("SC_CLK_TCK")

# --------------------------------------------------------------------------- configuration


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=3, help="repetitions of none/trainmaster (default 3)")
    parser.add_argument("--steps", type=int, default=2000, help="measured steps per none/trainmaster job")
    parser.add_argument("--warmup-steps", type=int, default=50, help="unmeasured steps first, same mode")
    parser.add_argument("--report-runs", type=int, default=2, help="ray_report jobs (default 2; 0 skips)")
    parser.add_argument("--report-steps", type=int, default=5, help="measured steps per ray_report job")
    parser.add_argument("--report-warmup-steps", type=int, default=1, help="unmeasured steps per ray_report job")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (default 2)")
    parser.add_argument("--batch", type=int, default=64, help="rows of the fixed batch")
    parser.add_argument("--features", type=int, default=256, help="MLP input width")
    parser.add_argument("--hidden", type=int, default=256, help="MLP hidden width")
    parser.add_argument("--job-timeout", type=float, default=300.0, help="seconds one job may take")
    parser.add_argument("--quiet-load", type=float, default=1.5, help="1-minute load to wait for before measuring")
    parser.add_argument("--quiet-wait", type=float, default=300.0, help="longest wait for that load, seconds")
    parser.add_argument("--output", type=Path, default=RESULTS / f"{NAME}.json", help="JSON results file")
    parser.add_argument("--markdown", type=Path, default=RESULTS / f"{NAME}.md", help="README section file")
    parser.add_argument("--keep-home", action="store_true", help="keep the temporary TRAINMASTER_HOME (logs)")
    args = parser.parse_args(argv)
    if min(args.reps, args.steps, args.report_steps, args.workers) < 1 or args.report_runs < 0:
        parser.error("--reps, --steps, --report-steps and --workers must be >= 1, --report-runs >= 0")
    if args.warmup_steps < 0 or args.report_warmup_steps < 0:
        parser.error("warm-up steps must be >= 0")
    return args


# --------------------------------------------------------------------------- CPU accounting


def process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used: user + system) of every live process."""
    table: dict[int, tuple[int, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            table[int(stat.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK)
        except (OSError, ValueError, IndexError):
            continue
    return table


def tree_cpu_seconds(root: int | None, table: dict[int, tuple[int, float]]) -> float:
    """CPU seconds of `root` and its live descendants."""
    if root is None or root not in table:
        return 0.0
    members, grew = {root}, True
    while grew:
        found = {pid for pid, (parent, _) in table.items() if parent in members} - members
        members |= found
        grew = bool(found)
    return sum(table[pid][1] for pid in members)


def server_pids(home: Path) -> dict[str, int | None]:
    """The API and dispatcher (from the supervisor's record) and the embedded PostgreSQL's postmaster."""
    try:
        supervised = {k: int(v) for k, v in json.loads((home / "supervised.json").read_text()).items()}
    except (OSError, ValueError):
        supervised = {}
    try:
        postmaster: int | None = int((home / "pgdata" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        postmaster = None
    return {"api": supervised.get("api"), "dispatcher": supervised.get("dispatcher"), "postgres": postmaster}


def server_cpu(pids: dict[str, int | None]) -> dict[str, float]:
    table = process_table()
    return {name: tree_cpu_seconds(pid, table) for name, pid in pids.items()}


# --------------------------------------------------------------------------- one job


def count_points(stack: Stack, job_id: str, name: str) -> dict[str, dict[str, int]]:
    """Points and distinct steps per rank of metric `name`, read page by page (the SDK reads one page)."""
    per_rank: dict[int, list[int | None]] = {}
    after = 0
    with httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30) as http:
        while True:
            response = http.get(
                f"/v1/jobs/{job_id}/metrics", params={"name": name, "after_seq": after, "limit": 10_000}
            )
            response.raise_for_status()
            items = response.json()["items"]
            if not items:
                break
            for item in items:
                per_rank.setdefault(int(item["rank"]), []).append(item["step"])
            after = max(int(item["seq"]) for item in items)
    return {
        str(rank): {"points": len(steps), "distinct_steps": len(set(steps))} for rank, steps in sorted(per_rank.items())
    }


@dataclass
class JobRun:
    mode: str
    steps: int
    warmup_steps: int
    label: str


def job_config(args: argparse.Namespace, run: JobRun, result_path: Path) -> dict[str, Any]:
    return {
        "mode": run.mode,
        "steps": run.steps,
        "warmup_steps": run.warmup_steps,
        "batch": args.batch,
        "features": args.features,
        "hidden": args.hidden,
        "result_path": str(result_path),
    }


def read_result(path: Path) -> dict[str, Any]:
    lines = path.read_text().splitlines() if path.exists() else []
    if len(lines) != 1:
        raise RuntimeError(f"{path}: expected one result line from rank 0, found {len(lines)}")
    return dict(json.loads(lines[0]))


def delivery(client: Any, stack: Stack, job_id: str, run: JobRun, workers: int) -> dict[str, Any]:
    """What arrived in the metrics store: `loss` per rank (trainmaster mode), `report/loss` (ray_report)."""
    logged = run.warmup_steps + run.steps
    loss = count_points(stack, job_id, "loss")
    out: dict[str, Any] = {"loss_per_rank": loss, "sdk_metrics_loss_count": len(client.metrics(job_id, names=["loss"]))}
    if run.mode == TRAINMASTER_LOG:
        out["expected_per_rank"] = logged
        out["complete"] = len(loss) == workers and all(
            r["points"] == logged and r["distinct_steps"] == logged for r in loss.values()
        )
    else:
        out["complete"] = not loss
    if run.mode == RAY_REPORT:
        reported = count_points(stack, job_id, "report/loss")
        out["report_loss_points"] = sum(r["points"] for r in reported.values())
        out["report_loss_expected"] = logged
    return out


# --------------------------------------------------------------------------- the schedule


@dataclass
class Bench:
    args: argparse.Namespace
    stack: Stack
    client: Any
    workdir: Path
    results_dir: Path
    pids: dict[str, int | None]

    def run(self, run: JobRun) -> dict[str, Any]:
        from trainmaster.errors import WaitTimeout

        idle_wait = wait_cluster_idle(self.stack)
        load = load_1m()
        result_path = self.results_dir / f"{run.label}-{run.mode}.jsonl"
        cpu_before = server_cpu(self.pids)
        job = self.client.submit(
            name=f"bench-steps-{run.mode}-{run.label}",
            entrypoint=ENTRYPOINT,
            working_dir=self.workdir,
            scaling=self._scaling(),
            config=job_config(self.args, run, result_path),
        )
        try:
            job.wait(timeout=self.args.job_timeout, poll_interval=0.5)
        except WaitTimeout:
            self.client.cancel(job.id)
            raise
        cpu_after = server_cpu(self.pids)
        record = {
            "label": run.label,
            "job_id": job.id,
            "load_1m_at_start": load,
            "idle_wait_s": idle_wait,
            **read_result(result_path),
            "server_cpu_s": {k: cpu_after[k] - cpu_before[k] for k in cpu_before},
            "delivery": delivery(self.client, self.stack, job.id, run, self.args.workers),
        }
        print(
            f"  {run.label:<9} {run.mode:<11} {record['steps_per_s']:8.2f} steps/s  "
            f"complete={record['delivery']['complete']}  (load {load:.2f})",
            flush=True,
        )
        return record

    def _scaling(self) -> Any:
        import trainmaster as tm

        return tm.Scaling(num_workers=self.args.workers)

    def plan(self) -> list[JobRun]:
        """none/trainmaster alternating in order; ray_report jobs spread evenly after repetitions."""
        a = self.args
        spread = a.reps - 1
        after = [round(i * spread / (a.report_runs - 1)) for i in range(a.report_runs)] if a.report_runs > 1 else []
        after = after or [0] * a.report_runs
        runs: list[JobRun] = []
        for rep in range(a.reps):
            order = (NONE, TRAINMASTER_LOG) if rep % 2 == 0 else (TRAINMASTER_LOG, NONE)
            runs += [JobRun(mode, a.steps, a.warmup_steps, f"rep-{rep + 1}") for mode in order]
            runs += [JobRun(RAY_REPORT, a.report_steps, a.report_warmup_steps, f"rep-{rep + 1}")] * after.count(rep)
        return runs

    def schedule(self) -> dict[str, Any]:
        print("warm-up job (mode none, not measured)", flush=True)
        warmup = self.run(JobRun(NONE, max(1, self.args.steps // 10), self.args.warmup_steps, "warmup"))
        print("waiting for a quiet machine before the measured jobs", flush=True)
        quiet = wait_for_quiet_stack(self.args.quiet_load, self.args.quiet_wait)
        runs = [self.run(run) for run in self.plan()]
        return {"warmup": warmup, "runs": runs, "quiet_wait": quiet}


# --------------------------------------------------------------------------- statistics and report


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        values = [r["steps_per_s"] for r in runs if r["mode"] == mode]
        if values:
            out[mode] = {
                "runs": len(values),
                "median_steps_per_s": statistics.median(values),
                "min_steps_per_s": min(values),
                "max_steps_per_s": max(values),
                "median_rank0_cpu_ms_per_step": statistics.median(
                    r["process_cpu_s"] / r["steps"] * 1000 for r in runs if r["mode"] == mode
                ),
                "median_server_cpu_s": {
                    k: statistics.median(r["server_cpu_s"][k] for r in runs if r["mode"] == mode)
                    for k in runs[0]["server_cpu_s"]
                },
            }
    base = out[NONE]["median_steps_per_s"]
    for mode in out:
        out[mode]["ratio_vs_none"] = out[mode]["median_steps_per_s"] / base
    out["trainmaster_meets_target"] = out[TRAINMASTER_LOG]["ratio_vs_none"] >= TARGET_RATIO
    out["all_points_arrived"] = all(r["delivery"]["complete"] for r in runs)
    return out


RUN_HEADER = [
    "job",
    "mode",
    "steps",
    "steps/s",
    "median / mean / p99 step ms",
    "rank-0 CPU ms/step (process / main thread)",
    "points ok",
    "API / PG CPU s",
    "load 1m",
]
SUMMARY_HEADER = ["mode", "jobs", "median steps/s", "min", "max", "vs none"]


def runs_table(runs: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            r["label"],
            r["mode"],
            str(r["steps"]),
            f"{r['steps_per_s']:.2f}",
            f"{r['median_step_ms']:.2f} / {r['mean_step_ms']:.2f} / {r['p99_step_ms']:.2f}",
            f"{r['process_cpu_s'] / r['steps'] * 1000:.2f} / {r['main_thread_cpu_s'] / r['steps'] * 1000:.2f}",
            points_cell(r),
            f"{r['server_cpu_s']['api']:.1f} / {r['server_cpu_s']['postgres']:.1f}",
            f"{r['load_1m_at_start']:.2f}",
        ]
        for r in runs
    ]


def points_cell(record: dict[str, Any]) -> str:
    d = record["delivery"]
    if record["mode"] == TRAINMASTER_LOG:
        counts = "+".join(str(r["points"]) for r in d["loss_per_rank"].values()) or "0"
        return f"{counts} / {d['expected_per_rank']}x{len(d['loss_per_rank']) or 0}"
    if record["mode"] == RAY_REPORT:
        return f"report/loss {d['report_loss_points']}/{d['report_loss_expected']}"
    return "-" if d["complete"] else "unexpected points"


def summary_rows(s: dict[str, Any]) -> list[list[str]]:
    return [
        [
            mode,
            str(s[mode]["runs"]),
            f"{s[mode]['median_steps_per_s']:.2f}",
            f"{s[mode]['min_steps_per_s']:.2f}",
            f"{s[mode]['max_steps_per_s']:.2f}",
            f"{s[mode]['ratio_vs_none']:.3f}x",
        ]
        for mode in MODES
        if mode in s
    ]


def noise(s: dict[str, Any], runs: list[dict[str, Any]]) -> str | None:
    """Why this run cannot settle the target, if it cannot: a loaded machine or too much spread."""
    cpus = os.cpu_count() or 1
    peak = max(r["load_1m_at_start"] for r in runs)
    spread = max(
        (s[m]["max_steps_per_s"] - s[m]["min_steps_per_s"]) / s[m]["median_steps_per_s"]
        for m in (NONE, TRAINMASTER_LOG)
    )
    if peak <= 2 * cpus and spread <= 2 * (1 - TARGET_RATIO):  # one job of ours alone keeps the load near cpus
        return None
    return f"1-minute load up to {peak:.1f} on {cpus} cores and a spread of {spread:.0%} between jobs of one mode"


def interpretation(s: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    tm_ratio = s[TRAINMASTER_LOG]["ratio_vs_none"]
    cpu_none, cpu_tm = (s[m]["median_rank0_cpu_ms_per_step"] for m in (NONE, TRAINMASTER_LOG))
    text = f"`trainmaster.log` every step runs at {tm_ratio:.3f}x the steps/s of no logging"
    caveat = noise(s, runs)
    if caveat is None:
        text += f": it {'meets' if s['trainmaster_meets_target'] else 'misses'} the {TARGET_RATIO}x target"
    else:
        text += f", but with {caveat} this run cannot tell whether it meets the {TARGET_RATIO}x target"
    text += (
        f"; rank 0's CPU per step (less sensitive to other load) is {cpu_tm:.2f} ms with it vs {cpu_none:.2f} ms "
        f"without ({cpu_tm / cpu_none - 1:+.0%})"
    )
    if RAY_REPORT in s:
        text += f"; `ray.train.report` every step runs at {s[RAY_REPORT]['ratio_vs_none']:.4f}x"
    points = "every logged point arrived" if s["all_points_arrived"] else "SOME POINTS WERE MISSING"
    return f"{text}; {points}."


def markdown(results: dict[str, Any]) -> str:
    s, load, quiet, cfg = results["summary"], results["loadavg_1m"], results["quiet_wait"], results["config"]
    cpu = {mode: s[mode]["median_server_cpu_s"] for mode in MODES if mode in s}
    return "\n".join(
        [
            "## Logging overhead in the training loop (`trainmaster.log` vs `ray.train.report`)",
            "",
            "```",
            f".venv/bin/python {results['command'].split(' ', 1)[1]} # defaults: --reps 3 --steps 2000 --report-runs 2",
            "```",
            "",
            f"Jobs submitted through the SDK to the script's own `trainmaster up` stack: {cfg['workers']} workers, "
            f"DDP over gloo, an MLP {cfg['features']}-{cfg['hidden']}-{cfg['hidden']}-10 on one fixed batch of "
            f"{cfg['batch']} (`bench/step_loop_job.py`). Rank 0 times {cfg['steps']} steps after "
            f"{cfg['warmup_steps']} warm-up steps (ray_report: {cfg['report_steps']} after "
            f"{cfg['report_warmup_steps']}); modes differ only by the call after each step. none/trainmaster "
            "alternate, order flipped every repetition; the Ray cluster is idle before each job.",
            "",
            f"**Machine.** {results['machine']['cpus']} shared cores (another engineer's tests ran concurrently); the "
            "workers, the API and PostgreSQL share them. "
            f"Python {results['machine']['python']}; git `{results['git']}`; {results['measured_at']}. "
            f"1-minute load average: {load['start']:.2f} at the start, {load['before_measured']:.2f} before the "
            f"measured jobs (waited {quiet['waited_s']:.0f} s for < {quiet['threshold']}"
            f"{'' if quiet['quiet'] else ', not reached'}), {load['end']:.2f} at the end.",
            "",
            md_table(RUN_HEADER, runs_table(results["runs"])),
            "",
            md_table(SUMMARY_HEADER, summary_rows(s)),
            "",
            "Median CPU seconds used during one job by the API / PostgreSQL: "
            + ", ".join(f"{mode} {c['api']:.1f} / {c['postgres']:.1f}" for mode, c in cpu.items())
            + ". Median CPU of rank 0's process (all threads) per measured step: "
            + ", ".join(f"{mode} {s[mode]['median_rank0_cpu_ms_per_step']:.2f} ms" for mode in cpu)
            + ".",
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
    print(text_table(SUMMARY_HEADER, summary_rows(s)))
    print("1-minute load average: " + ", ".join(f"{k} {v:.2f}" for k, v in loadavg.items()))
    print(interpretation(s, measured["runs"]))
    return results


# --------------------------------------------------------------------------- main


def run_benchmark(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    import trainmaster as tm

    loadavg = {"start": load_1m()}
    workdir, results_dir = prepare_home(home, JOB_FILE, "step-results")
    with running_stack(home) as stack:
        print(f"stack up: api {stack.api_url}", flush=True)
        with tm.Client(api_url=stack.api_url, token=stack.token) as client:
            bench = Bench(args, stack, client, workdir, results_dir, server_pids(home))
            measured = bench.schedule()
        loadavg["before_measured"] = measured["quiet_wait"]["load_last"]
        loadavg["end"] = load_1m()
    return report(args, measured, loadavg)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    results = in_temp_home("tm-bench-logging-", args.keep_home, lambda home: run_benchmark(args, home))
    write_results(results, args.output, (args.markdown, markdown(results)))
    return 0 if results["summary"]["all_points_arrived"] else 1


if __name__ == "__main__":
    run_main(main, "the stack was stopped")
