"""Time from submit to the first training step on a warm local cluster, against `TorchTrainer.fit()` direct.

On its own `trainmaster up`, the same `--workers`-worker function (`first_step` of bench/train_jobs.py,
alone in a working_dir) runs each of `--paths`, `--warmup` then `--runs` of each, interleaved, every Ray
CPU free before each run:

    platform  `client.submit(...)`, t0 just before it (code upload and POST included)
    direct    the peer: this process connected to the same Ray cluster (`ray.init`, timed apart and not
              counted), then t0 and `TorchTrainer(...).fit()`
    lean      as direct, with trainmaster's torch backend (`workers.lean_torch.lean_torch_trainer`: the
              same gloo process group, no torch import in the driver or the Ray Train controller)

"First step" is rank 0's stamp, "all started" the latest rank's. The job's events give the platform's
milestones. `--nodes 3 --workers 3 --strategy STRICT_SPREAD`: a gang across three Ray nodes.

    .venv/bin/python bench/submit_latency.py [--runs 5] [--warmup 1] [--workers 2] [--paths platform direct lean]
    .venv/bin/python bench/submit_latency.py --nodes 3 --workers 3 --strategy STRICT_SPREAD
"""

from __future__ import annotations

import argparse
import functools
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
    scaling = tm.Scaling(num_workers=args.workers, placement_strategy=args.strategy)
    job = client.submit(name="bench-first-step", entrypoint="train_jobs:first_step", working_dir=workdir,
                        scaling=scaling, config={"stamp_path": str(stamp)})  # fmt: skip
    marks: dict[str, float] = {"submit returned": time.time() - t0}
    job.wait(timeout=300, poll_interval=0.25)
    for event in client.events(job.id):
        mark = event.status.value if event.kind == "status" and event.status is not None else event.kind
        if mark in MARKS and MARKS[mark] not in marks:
            marks[MARKS[mark]] = event.created_at.timestamp() - t0
        if event.kind == "driver" and DRIVER_PROCESS not in marks:
            marks[DRIVER_PROCESS] = event.created_at.timestamp() - float(event.data["startup_s"]) - t0
    first, everyone = stamps(stamp, args.workers)
    return {"first_step_s": first - t0, "all_started_s": everyone - t0, "marks_s": marks}


def driver_run(path: str, stack: Stack, workdir: Path, stamp: Path, args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.train.torch import TorchTrainer

    from workers.lean_torch import LeanTorchConfig, lean_torch_trainer

    trainer = (
        TorchTrainer
        if path == "direct"
        else functools.partial(lean_torch_trainer, torch_config=LeanTorchConfig(backend="gloo"))
    )
    began = time.time()
    ray.init(stack.head.gcs_address, runtime_env={"working_dir": str(workdir)}, log_to_driver=False,
             logging_level=logging.WARNING)  # fmt: skip
    try:
        connect_s = time.time() - began
        storage = stack.folder(f"{path}-{stamp.stem}")
        return {**fit(trainer, "bench-first-step", args.workers, stamp, storage, args.strategy), "connect_s": connect_s}
    finally:
        ray.shutdown()


def main() -> None:
    args = parse_args(
        __doc__,
        *RUNS,
        ("--nodes", 1, "Ray nodes of the local stack (trainmaster up --nodes)"),
        ("--strategy", "PACK", "placement strategy of the gang, every path"),
        ("--paths", ["platform", "direct"], "what runs, interleaved: platform, direct, lean"),
    )
    name = "submit_latency" if args.nodes == 1 else f"submit_latency_{args.nodes}nodes"
    with run(name, args) as record, local_stack(record, nodes=args.nodes) as stack, stack.client() as client:
        workdir, stamp_dir = stack.job_code("train_jobs.py"), stack.folder("stamps")
        # The driver paths are Ray drivers of the stack's cluster, which want the stack's Ray token.
        os.environ.update(stack.head.env)

        def one(path: str, n: int) -> dict[str, Any]:
            stack.wait_idle(client)
            stamp = stamp_dir / f"{path}-{n}.txt"
            if path == "platform":
                return platform_run(client, workdir, stamp, args)
            return driver_run(path, stack, workdir, stamp, args)

        runs = interleaved(args.paths, args.warmup, args.runs, one)
        first: dict[str, dict[str, Any]] = {
            path: {
                "path": path,
                "runs": len(rows),
                **spread((r["first_step_s"] for r in rows), "median_s", "min_s", "max_s"),
            }
            | {"all_started_median_s": median(rows, "all_started_s")}
            for path, rows in runs.items()
        }
        record.tables["first step"] = list(first.values())
        record.tables["runs"] = [{"path": path, **row} for path, rows in runs.items() for row in rows]
        gang = f"all {args.workers} workers started ({args.strategy}, {args.nodes} node(s))"
        for path in {"platform", "lean"} & set(first) if "direct" in first else ():
            ours, peer = first[path], first["direct"]
            record.ratio(f"{path}: submit to first step, median s", ours["median_s"], "direct fit()", peer["median_s"])
            record.ratio(f"{path}: submit to {gang}, median s", ours["all_started_median_s"], "direct fit()",
                         peer["all_started_median_s"])  # fmt: skip
        if marks := [r["marks_s"] for r in runs.get("platform", [])]:
            seen = [mark for mark in ORDER if all(mark in m for m in marks)]
            record.tables["platform, from t0 (medians)"] = [{"mark": mark, "s": median(marks, mark)} for mark in seen]


if __name__ == "__main__":
    main()
