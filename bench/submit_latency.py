"""Time from submit to the first training step on a warm local cluster, against `TorchTrainer.fit()` direct.

On its own `trainmaster up`, the same `--workers`-worker function (`first_step` of bench/train_jobs.py,
alone in a working_dir) runs two ways, `--warmup` then `--runs` of each, interleaved, every Ray CPU free
before each run: platform, `client.submit(...)` with t0 just before it (code upload and POST included);
direct, the peer, this process connected to the same Ray cluster (`ray.init`, timed apart and not
counted), then t0 and `TorchTrainer(...).fit()`. "First step" is rank 0's stamp, "all started" the
latest rank's. The job's events give the platform's milestones and whether its driver was forked warm
(workers/warm/; the stack's first job is cold). `--nodes 3 --workers 3 --strategy STRICT_SPREAD`: a gang
across three Ray nodes on this machine.

    .venv/bin/python bench/submit_latency.py [--runs 5] [--warmup 1] [--workers 2]
    .venv/bin/python bench/submit_latency.py --nodes 3 --workers 3 --strategy STRICT_SPREAD
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

from harness import RUNS, Stack, interleaved, local_stack, median, parse_args, run, spread
from train_jobs import fit, stamps

import trainmaster as tm

MARKS = {
    "starting": "admitted (status starting)",
    "driver": "driver up, imports done (event driver)",
    "gang_pending": "controller asks for the gang (event gang_pending)",
    "workers_started": "workers started (event workers_started)",
    "runtime": "rank 0 up (event runtime)",
}
DRIVER_PROCESS = "entrypoint process started by Ray Jobs (event driver - its startup_s)"
ORDER = ("submit returned", MARKS["starting"], DRIVER_PROCESS, *list(MARKS.values())[1:])


def platform_run(client: tm.Client, workdir: Path, stamp: Path, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.time()
    job = client.submit(
        name="bench-first-step",
        entrypoint="train_jobs:first_step",
        working_dir=workdir,
        scaling=tm.Scaling(num_workers=args.workers, placement_strategy=args.strategy),
        config={"stamp_path": str(stamp)},
    )
    marks: dict[str, float] = {"submit returned": time.time() - t0}
    job.wait(timeout=300, poll_interval=0.25)
    warm = None
    for event in client.events(job.id):
        mark = event.status.value if event.kind == "status" and event.status is not None else event.kind
        if mark in MARKS and MARKS[mark] not in marks:
            marks[MARKS[mark]] = event.created_at.timestamp() - t0
        if event.kind == "driver" and DRIVER_PROCESS not in marks:
            marks[DRIVER_PROCESS] = event.created_at.timestamp() - float(event.data["startup_s"]) - t0
            warm = bool(event.data.get("warm"))
    first, everyone = stamps(stamp, args.workers)
    return {"first_step_s": first - t0, "all_started_s": everyone - t0, "marks_s": marks, "warm_driver": warm}


def direct_run(stack: Stack, workdir: Path, stamp: Path, args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.train.torch import TorchTrainer

    began = time.time()
    env = {"working_dir": str(workdir)}
    ray.init(stack.ray_gcs, runtime_env=env, log_to_driver=False, logging_level=logging.WARNING)
    try:
        connect_s = time.time() - began
        measured = fit(
            TorchTrainer, "bench-first-step", args.workers, stamp, stack.folder(f"direct-{stamp.stem}"), args.strategy
        )
    finally:
        ray.shutdown()
    return {**measured, "connect_s": connect_s}


def main() -> None:
    args = parse_args(
        __doc__,
        *RUNS,
        ("--nodes", 1, "Ray nodes of the local stack (trainmaster up --nodes)"),
        ("--strategy", "PACK", "placement strategy of the gang, both paths"),
    )
    name = "submit_latency" if args.nodes == 1 else f"submit_latency_{args.nodes}nodes"
    with run(name, args) as record, local_stack(record, nodes=args.nodes) as stack, stack.client() as client:
        workdir, stamp_dir = stack.job_code("train_jobs.py"), stack.folder("stamps")
        # The direct path is a Ray driver of the stack's cluster, which wants the stack's Ray token.
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(stack.home / "ray_auth_token"))

        def one(path: str, n: int) -> dict[str, Any]:
            stack.wait_idle(client)
            stamp = stamp_dir / f"{path}-{n}.txt"
            if path == "platform":
                return platform_run(client, workdir, stamp, args)
            return direct_run(stack, workdir, stamp, args)

        runs = interleaved(("platform", "direct"), args.warmup, args.runs, one)
        platform, direct = record.tables["first step"] = [
            {"path": path, "runs": len(rows), **spread((r["first_step_s"] for r in rows), "median_s", "min_s", "max_s")}
            | {"all_started_median_s": median(rows, "all_started_s")}
            for path, rows in runs.items()
        ]
        figure = "platform: submit to first step, median s"
        record.ratio(figure, platform["median_s"], "direct fit()", direct["median_s"])
        gang = f"{args.workers} workers started ({args.strategy}, {args.nodes} node(s))"
        figure = f"platform: submit to all {gang}, median s"
        record.ratio(figure, platform["all_started_median_s"], "direct fit()", direct["all_started_median_s"])
        marks = [r["marks_s"] for r in runs["platform"]]
        seen = [mark for mark in ORDER if all(mark in m for m in marks)]
        medians = [{"mark": mark, "s": median(marks, mark)} for mark in seen]
        record.tables["platform, from t0 (medians)"] = [*medians, {"mark": "first step", "s": platform["median_s"]}]
        record.tables["runs"] = [
            {
                "run": n + 1,
                "platform_s": ours["first_step_s"],
                "direct_s": peer["first_step_s"],
                "direct_connect_s": peer["connect_s"],  # not counted in direct_s
                "platform_driver": "warm" if ours["warm_driver"] else "cold",
                "load_1m_platform": ours["load_1m_at_start"],
                "load_1m_direct": peer["load_1m_at_start"],
            }
            for n, (ours, peer) in enumerate(zip(runs["platform"], runs["direct"], strict=True))
        ]


if __name__ == "__main__":
    main()
