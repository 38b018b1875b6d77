"""Steps/s of a small DDP loop logging every step with `trainmaster.log`, against no logging and
against `ray.train.report`.

On its own `trainmaster up`, jobs of `step_loop` (bench/train_jobs.py: an MLP under DDP over gloo on one
fixed batch, `--workers` workers; rank 0 times `--steps` steps after `--warmup-steps`) differ only by the
call after each step: none (the peer every figure is divided by), trainmaster (every point must then be
stored, on every rank) or ray_report (a barrier with Ray Train's controller; `--report-steps` only).
After one unmeasured job: `--reps` repetitions of none and trainmaster (order flipped each time), a
ray_report job after each of the first `--report-runs`; then `--alternate-jobs` jobs alternating blocks
of `--block` steps without and with logging, each logging block divided by the block before it (whole
jobs move by 20% with this machine's neighbours, neighbouring blocks far less). With `--pin` (default on
2+ cores) the Ray side runs on CPU 0, the API, dispatcher, PostgreSQL and this script on CPU 1
(`taskset`): the figure is what training pays itself, not its share of a shared core.

    .venv/bin/python bench/logging_overhead.py [--reps 3] [--steps 2000] [--report-runs 2] [--no-pin]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from collections import Counter
from typing import Any

import psutil
from harness import Record, Stack, load_1m, local_stack, median, parse_args, run, spread

import trainmaster as tm

TRAIN_CPU, PLATFORM_CPU = 0, 1
PIN_FLAG = {"action": argparse.BooleanOptionalAction}


def run_job(client: tm.Client, stack: Stack, mode: str, label: str, args: argparse.Namespace) -> dict[str, Any]:
    """One job; rank 0's result line, and whether every logged point was stored."""
    stack.wait_idle(client)
    load, result_path = load_1m(), stack.shared / "results" / f"{label}-{mode}.jsonl"
    steps, warmup = (args.report_steps, 1) if mode == "ray_report" else (args.steps, args.warmup_steps)
    config = {"mode": mode, "steps": steps, "warmup_steps": warmup, "result_path": str(result_path)}
    job = client.submit(
        name=f"bench-steps-{mode}-{label}",
        entrypoint="train_jobs:step_loop",
        working_dir=stack.home / "job-code",
        scaling=tm.Scaling(num_workers=args.workers),
        config=config | {"block": args.block},
    )
    job.wait(timeout=300, poll_interval=0.5)
    lines = result_path.read_text().splitlines() if result_path.exists() else []
    if len(lines) != 1:
        raise RuntimeError(f"{result_path}: expected one result line from rank 0, found {len(lines)}")
    per_rank = Counter(point.rank for point in client.metrics(job.id, names=["loss"]))
    result = json.loads(lines[0])
    logged = warmup + steps if mode == "trainmaster" else 0
    if mode == "alternate":  # (without, with) for each logging block and the block just before it
        blocks = result["blocks"]
        logged = warmup + sum(args.block for block in blocks if block["logging"])
        pairs = [(blocks[n - 1], blocks[n]) for n in range(1, len(blocks)) if blocks[n]["logging"]]
        ratios = [on["steps_per_s"] / off["steps_per_s"] for off, on in pairs]
        result = {
            "mode": mode,
            "steps": steps,
            "pairs": len(pairs),
            **spread(ratios, "ratio_median", "ratio_min", "ratio_max"),
            "cpu_ratio_median": statistics.median(off["cpu_ms_per_step"] / on["cpu_ms_per_step"] for off, on in pairs),
            "off_steps_per_s": median((off for off, _ in pairs), "steps_per_s"),
            "on_steps_per_s": median((on for _, on in pairs), "steps_per_s"),
        }
    expected = {rank: logged for rank in range(args.workers)} if logged else {}
    row = {"job": label, **result, "points_complete": dict(per_rank) == expected, "load_1m": load}
    rate = f"{row['steps_per_s']:8.2f} steps/s" if "steps_per_s" in row else f"{row['ratio_median']:.3f}x"
    print(f"{label:<7} {mode:<11} {rate}  points complete: {row['points_complete']}", flush=True)
    return row


def pin(stack: Stack) -> list[dict[str, Any]]:
    """Every process of the stack onto its side (all threads, with `taskset -a`); children made later
    inherit it. Returns what was pinned where."""
    state = json.loads((stack.home / "stack.json").read_text())
    ray_marker, home = state.get("ray_temp_dir") or "\0", str(stack.home)
    roots: dict[int, int] = {}
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if ray_marker in cmdline:
            roots[process.pid] = TRAIN_CPU
        elif home in cmdline or process.pid == state.get("supervisor_pid"):
            roots.setdefault(process.pid, PLATFORM_CPU)
    pinned: dict[int, int] = {}
    for pid, cpu in roots.items():
        try:
            for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                pinned.setdefault(process.pid, cpu)
        except psutil.NoSuchProcess:
            continue
    pinned[os.getpid()] = PLATFORM_CPU
    for pid, cpu in pinned.items():
        subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], capture_output=True, check=False)
    return [
        {"cpu": cpu, "processes": n, "side": "training" if cpu == TRAIN_CPU else "platform"}
        for cpu, n in Counter(pinned.values()).items()
    ]


def tables(jobs: list[dict[str, Any]], record: Record) -> None:
    record.tables["jobs"] = [job for job in jobs if job["mode"] != "alternate"]
    if alternating := [job for job in jobs if job["mode"] == "alternate"]:
        record.tables["alternating blocks in one job (with logging / the block before, without)"] = alternating
        ratio = median(alternating, "ratio_median")
        record.ratio("trainmaster every step, alternating blocks, median of pairs", ratio, "no logging", 1.0)
    by_mode = {mode: [job for job in jobs if job["mode"] == mode] for mode in ("none", "trainmaster", "ray_report")}
    record.tables["steps per second"] = [
        {"mode": mode, "jobs": len(runs), **spread(job["steps_per_s"] for job in runs)}
        | {"rank0_cpu_ms_per_step": median(runs, "cpu_ms_per_step")}
        for mode, runs in by_mode.items()
        if runs
    ]
    medians = {row["mode"]: row["median"] for row in record.tables["steps per second"]}
    for mode in ("trainmaster", "ray_report"):
        if mode in medians and "none" in medians:
            record.ratio(f"{mode} every step, steps/s", medians[mode], "no logging", medians["none"])
    # Other load on the machine moves whole jobs; the two jobs of one repetition ran back to back,
    # and the training process's own CPU per step is what logging adds to the step itself.
    pairs = [
        {
            "repetition": rep,
            "ratio_steps_per_s": by["trainmaster"]["steps_per_s"] / by["none"]["steps_per_s"],
            "ratio_cpu_per_step": by["none"]["cpu_ms_per_step"] / by["trainmaster"]["cpu_ms_per_step"],
            "load_1m": by["trainmaster"]["load_1m"],
        }
        for rep in sorted({job["job"] for job in jobs if job["job"].startswith("rep-")})
        if len(by := {job["mode"]: job for job in jobs if job["job"] == rep and job["mode"] != "ray_report"}) == 2
    ]
    record.tables["repetitions, trainmaster against none"] = pairs
    if pairs:
        steps_ratio, cpu_ratio = median(pairs, "ratio_steps_per_s"), median(pairs, "ratio_cpu_per_step")
        record.ratio("trainmaster every step, steps/s, median of repetitions", steps_ratio, "no logging", 1.0)
        record.ratio("trainmaster every step, rank 0 CPU per step (inverse)", cpu_ratio, "no logging", 1.0)
    record.valid = all(job["points_complete"] for job in jobs)


def main() -> None:
    args = parse_args(
        __doc__,
        ("--reps", 3, "repetitions of none and trainmaster"),
        ("--steps", 2000, "measured steps per none/trainmaster job"),
        ("--warmup-steps", 50, "unmeasured steps first"),
        ("--report-runs", 2, "ray_report jobs (0: none)"),
        ("--report-steps", 5, "measured steps per ray_report job"),
        ("--alternate-jobs", 1, "jobs alternating blocks without and with logging"),
        ("--block", 100, "steps per block of an alternate job"),
        ("--workers", 2, "Ray Train workers"),
        ("--pin", (os.cpu_count() or 1) >= 2, "split training and platform onto two CPUs (taskset)", PIN_FLAG),
    )
    with run("logging_overhead", args) as record, local_stack(record) as stack, stack.client() as client:
        if args.pin:
            record.tables["pinned"] = pin(stack)
        stack.job_code("train_jobs.py")
        stack.folder("results")
        run_job(client, stack, "none", "warmup", args)
        jobs = []
        for rep in range(args.reps):
            for mode in ("none", "trainmaster") if rep % 2 == 0 else ("trainmaster", "none"):
                jobs.append(run_job(client, stack, mode, f"rep-{rep + 1}", args))
            if rep < args.report_runs:
                jobs.append(run_job(client, stack, "ray_report", f"rep-{rep + 1}", args))
        jobs += [run_job(client, stack, "alternate", f"alt-{n + 1}", args) for n in range(args.alternate_jobs)]
        tables(jobs, record)


if __name__ == "__main__":
    main()
