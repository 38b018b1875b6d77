"""Time from submit to the first training step on a warm local cluster, against `TorchTrainer.fit()` direct.

On its own `trainmaster up` (fresh TRAINMASTER_HOME), the same `--workers`-worker function
(bench/first_step_job.py, alone in a working_dir) runs two ways, `--warmup` then `--runs` of each,
interleaved, every Ray CPU free before each run:

platform  `client.submit(entrypoint="first_step_job:train_loop_per_worker", working_dir=..., scaling=...)`;
          t0 just before submit (code upload and POST included).
direct    the peer: this process connects to the same Ray cluster (`ray.init`, timed apart and not
          counted), then t0, `TorchTrainer(...).fit()`.

"First step" is when rank 0 stamps its first step; "all started" the latest rank's stamp. The job's
events give the platform's milestones (admitted, driver up, gang asked, workers started, rank 0 up) and
whether its driver was forked warm by the node's warm server (workers/warm/; the stack's first job is
cold). `--nodes 3 --workers 3 --strategy STRICT_SPREAD`: a gang across three Ray nodes on this machine.

    .venv/bin/python bench/submit_latency.py [--runs 5] [--warmup 1] [--workers 2]
    .venv/bin/python bench/submit_latency.py --nodes 3 --workers 3 --strategy STRICT_SPREAD
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from first_step_job import fit, stamps
from harness import Stack, interleaved, local_stack, parser, run, spread, wait_cluster_idle, wait_job

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
        entrypoint="first_step_job:train_loop_per_worker",
        working_dir=workdir,
        scaling=tm.Scaling(num_workers=args.workers, placement_strategy=args.strategy),
        config={"stamp_path": str(stamp)},
    )
    submitted = time.time()
    wait_job(client, job, args.job_timeout, 0.25)
    marks: dict[str, float] = {"submit returned": submitted - t0}
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
    ray.init(
        stack.ray_gcs, runtime_env={"working_dir": str(workdir)}, log_to_driver=False, logging_level=logging.WARNING
    )
    try:
        connect_s = time.time() - began
        measured = fit(TorchTrainer, "bench-first-step", args.workers, stamp, stack.home / "direct", args.strategy)
    finally:
        ray.shutdown()
    return {**measured, "connect_s": connect_s}


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=5, help="measured runs of each path")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each path first")
    p.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    p.add_argument("--job-timeout", type=float, default=300.0, help="seconds one run may take")
    p.add_argument("--nodes", type=int, default=1, help="Ray nodes of the local stack (trainmaster up --nodes)")
    p.add_argument("--strategy", default="PACK", help="placement strategy of the gang, both paths")
    args = p.parse_args()
    name = "submit_latency" if args.nodes == 1 else f"submit_latency_{args.nodes}nodes"
    with run(name, args) as record, local_stack(record, nodes=args.nodes) as stack:
        workdir, stamp_dir = stack.job_code("first_step_job.py"), stack.home / "stamps"
        stamp_dir.mkdir()
        # The direct path is a Ray driver of the stack's cluster, which wants the stack's Ray token.
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(stack.home / "ray_auth_token"))
        with tm.Client(api_url=stack.api_url, token=stack.token) as client:

            def one(path: str, n: int) -> dict[str, Any]:
                wait_cluster_idle(client)
                stamp = stamp_dir / f"{path}-{n}.txt"
                return (
                    platform_run(client, workdir, stamp, args)
                    if path == "platform"
                    else direct_run(stack, workdir, stamp, args)
                )

            runs = interleaved(("platform", "direct"), args.warmup, args.runs, one)
        record.tables["first step"] = [
            {
                "path": path,
                "runs": len(rows),
                **spread((r["first_step_s"] for r in rows), "median_s", "min_s", "max_s"),
                "all_started_median_s": statistics.median(r["all_started_s"] for r in rows),
            }
            for path, rows in runs.items()
        ]
        platform, direct = record.tables["first step"]
        record.ratio(
            "platform: submit to first step, median s", platform["median_s"], "direct fit()", direct["median_s"]
        )
        record.ratio(
            f"platform: submit to all {args.workers} workers started ({args.strategy}, {args.nodes} node(s)), median s",
            platform["all_started_median_s"],
            "direct fit()",
            direct["all_started_median_s"],
        )
        marks = [r["marks_s"] for r in runs["platform"]]
        record.tables["platform, from t0 (medians)"] = [
            {"mark": mark, "s": statistics.median(m[mark] for m in marks)}
            for mark in ORDER
            if all(mark in m for m in marks)
        ] + [{"mark": "first step", "s": platform["median_s"]}]
        record.tables["runs"] = [
            {
                "run": n + 1,
                "platform_s": on_platform["first_step_s"],
                "direct_s": fit["first_step_s"],
                "direct_connect_s": fit["connect_s"],  # not counted in direct_s
                "platform_driver": "warm" if on_platform["warm_driver"] else "cold",
                "load_1m_platform": on_platform["load_1m_at_start"],
                "load_1m_direct": fit["load_1m_at_start"],
            }
            for n, (on_platform, fit) in enumerate(zip(runs["platform"], runs["direct"], strict=True))
        ]
    return 0


if __name__ == "__main__":
    sys.exit(main())
