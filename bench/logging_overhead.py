"""Steps/s of a small DDP loop logging every step with `trainmaster.log`, against the same loop without.

On its own `trainmaster up`, jobs of `step_loop` (bench/train_jobs.py: an MLP under DDP over gloo on one
fixed batch, `--workers` workers; rank 0 times `--steps` steps after `--warmup-steps`) differ only by the
call after each step: none (the peer) or trainmaster (every point must then be stored, on every rank).
After one unmeasured job: `--reps` repetitions of none and trainmaster (order flipped each time); then
`--alternate-jobs` jobs alternating blocks of `--block` steps without and with logging in the same
processes, each logging block divided by the block before it: neighbouring blocks share the machine's
state, which whole jobs a minute apart do not. With `--pin` (default on 2+ cores) the Ray side runs on
CPU 0, the API, dispatcher, PostgreSQL and this script on CPU 1 (`taskset`): the figure is what training
pays itself, not its share of a shared core.

    .venv/bin/python bench/logging_overhead.py [--reps 3] [--steps 2000] [--alternate-jobs 1] [--no-pin]
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
from harness import Stack, load_1m, local_stack, median, parse_args, run, spread

import trainmaster as tm

TRAIN_CPU, PLATFORM_CPU = 0, 1


def run_job(client: tm.Client, stack: Stack, mode: str, label: str, args: argparse.Namespace) -> dict[str, Any]:
    """One job; rank 0's result line, and whether every logged point was stored."""
    stack.wait_idle(client)
    load, result_path = load_1m(), stack.shared / "results" / f"{label}-{mode}.jsonl"
    config = {"mode": mode, "steps": args.steps, "warmup_steps": args.warmup_steps, "block": args.block}
    job = client.submit(name=f"bench-steps-{mode}-{label}", entrypoint="train_jobs:step_loop",
                        working_dir=stack.home / "job-code", scaling=tm.Scaling(num_workers=args.workers),
                        config=config | {"result_path": str(result_path)})  # fmt: skip
    job.wait(timeout=300, poll_interval=0.5)
    lines = result_path.read_text().splitlines() if result_path.exists() else []
    if len(lines) != 1:
        raise RuntimeError(f"{result_path}: expected one result line from rank 0, found {len(lines)}")
    per_rank = Counter(point.rank for point in client.metrics(job.id, names=["loss"]))
    result = json.loads(lines[0])
    logged = args.warmup_steps + args.steps if mode == "trainmaster" else 0
    if mode == "alternate":  # (without, with) for each logging block and the block just before it
        blocks = result.pop("blocks")
        logged = args.warmup_steps + sum(args.block for block in blocks if block["logging"])
        pairs = [(blocks[n - 1], blocks[n]) for n in range(1, len(blocks)) if blocks[n]["logging"]]
        result |= {"pairs": len(pairs), **spread((on["steps_per_s"] / off["steps_per_s"] for off, on in pairs),
                                                 "ratio_median", "ratio_min", "ratio_max")}  # fmt: skip
    expected = {rank: logged for rank in range(args.workers)} if logged else {}
    row = {"job": label, **result, "points_complete": dict(per_rank) == expected, "load_1m": load}
    rate = f"{row['steps_per_s']:8.2f} steps/s" if "steps_per_s" in row else f"{row['ratio_median']:.3f}x"
    print(f"{label:<7} {mode:<11} {rate}  points complete: {row['points_complete']}", flush=True)
    return row


def pin(stack: Stack) -> list[dict[str, Any]]:
    """Every process of the stack onto its side (all threads, with `taskset -a`); children made later
    inherit it. Returns what was pinned where."""
    state = json.loads((stack.home / "stack.json").read_text())
    roots: dict[int, int] = {}
    ray_marker = state.get("ray_temp_dir") or "\0"  # every process of the stack's Ray names it
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if ray_marker in cmdline:
            roots[process.pid] = TRAIN_CPU
        elif str(stack.home) in cmdline or process.pid == state.get("supervisor_pid"):
            roots.setdefault(process.pid, PLATFORM_CPU)
    pinned: dict[int, int] = {os.getpid(): PLATFORM_CPU}
    for pid, cpu in roots.items():
        try:
            for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                pinned.setdefault(process.pid, cpu)
        except psutil.NoSuchProcess:
            continue
    for pid, cpu in pinned.items():
        subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], capture_output=True, check=False)
    return [{"cpu": cpu, "processes": n, "side": "training" if cpu == TRAIN_CPU else "platform"}
            for cpu, n in Counter(pinned.values()).items()]  # fmt: skip


def main() -> None:
    args = parse_args(
        __doc__,
        ("--reps", 3, "repetitions of none and trainmaster"),
        ("--steps", 2000, "measured steps per job"),
        ("--warmup-steps", 50, "unmeasured steps first"),
        ("--alternate-jobs", 1, "jobs alternating blocks without and with logging"),
        ("--block", 100, "steps per block of an alternate job"),
        ("--workers", 2, "Ray Train workers"),
        ("--pin", (os.cpu_count() or 1) >= 2, "split training and platform onto two CPUs (taskset)",
         {"action": argparse.BooleanOptionalAction}),
    )
    with run("logging_overhead", args) as record, local_stack(record) as stack, stack.client() as client:
        if args.pin:
            record.tables["pinned"] = pin(stack)
        stack.job_code("train_jobs.py")
        stack.folder("results")
        run_job(client, stack, "none", "warmup", args)
        jobs = [run_job(client, stack, mode, f"rep-{rep + 1}", args)
                for rep in range(args.reps) for mode in ("none", "trainmaster")[:: 1 if rep % 2 == 0 else -1]]
        alternating = [run_job(client, stack, "alternate", f"alt-{n + 1}", args) for n in range(args.alternate_jobs)]
        record.tables["jobs"] = jobs
        if alternating:
            record.tables["alternating blocks in one job (with logging / the block before, without)"] = alternating
            ratio = median(alternating, "ratio_median")
            record.ratio("trainmaster every step, alternating blocks, median of pairs", ratio, "no logging", 1.0)
        # Other load on the machine moves whole jobs; the two jobs of one repetition ran back to back.
        by_rep = {rep: {job["mode"]: job for job in jobs if job["job"] == rep} for rep in {job["job"] for job in jobs}}
        pairs = [by["trainmaster"]["steps_per_s"] / by["none"]["steps_per_s"] for by in by_rep.values()]
        cpu = [by["none"]["cpu_ms_per_step"] / by["trainmaster"]["cpu_ms_per_step"] for by in by_rep.values()]
        if pairs:
            record.ratio("trainmaster every step, steps/s, median of repetitions", statistics.median(pairs),
                         "no logging", 1.0)  # fmt: skip
            record.ratio("trainmaster every step, rank 0 CPU per step (inverse), median of repetitions",
                         statistics.median(cpu), "no logging", 1.0)  # fmt: skip
        record.valid = all(job["points_complete"] for job in jobs + alternating)


if __name__ == "__main__":
    main()
