"""Recovery from a lost node: an elastic gang against a fixed one, side by side in one run.

A local stack (`trainmaster up`) and two worker nodes of one `slot` each: a gang of two workers
(`resources_per_worker: {CPU: 0.5, slot: 1}`, SPREAD) has one worker per node. `builtin:mlp` trains with
a checkpoint every epoch; after `--after-checkpoints` checkpoints the raylet of one worker's node is
SIGKILLed, as a machine that dies would leave it. Measured from the kill: to the first `loss` point of
the group Ray Train started after it (points the surviving worker logged before it noticed are not
training resumed), and the steps rank 0 had logged past the checkpoint the new group resumes from
(across a restart at the same size only: a step is a batch per worker).

    fixed    `num_workers: 2`, `max_failures: 1`: Ray Train restarts the whole group from its checkpoint
             once two slots are free again; a replacement node joins at once (its best case)
    elastic  `num_workers: {min: 1, max: 2}`: restarts on what is left; the replacement joins after the job

The figure is elastic / fixed; runs alternate (`--runs` of each, after `--warmup`).

    .venv/bin/python bench/recovery.py [--runs 2] [--warmup 0] [--after-checkpoints 2]
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

from harness import interleaved, local_stack, parse_args, run

import trainmaster as tm
from tests.factories.processes import MultiNode, wait_until

CONFIG = {"epochs": 8, "samples": 2048, "batch_size": 64, "epoch_sleep_s": 1.5}
SCALING = {"resources_per_worker": {"CPU": 0.5, "slot": 1}, "placement_strategy": "SPREAD"}
KINDS: dict[str, dict[str, Any]] = {"fixed": {"num_workers": 2}, "elastic": {"num_workers": {"min": 1, "max": 2}}}


def one_run(client: tm.Client, nodes: MultiNode, dead: list[Path], kind: str, args: Any) -> dict[str, Any]:
    for _ in range(2 - len(nodes.nodes)):
        nodes.add_node(1, {"slot": 1.0})
    scaling = tm.Scaling.model_validate({**SCALING, **KINDS[kind]})
    job = client.submit(name=f"recovery-{kind}", entrypoint="builtin:mlp", scaling=scaling, config=CONFIG,
                        max_failures=1 if kind == "fixed" else 0)  # fmt: skip
    wait_until(lambda: len(client.checkpoints(job.id)) >= args.after_checkpoints, 300, 0.5, "checkpoints")
    started = [e for e in client.events(job.id) if e.kind == "workers_started"][-1]
    folder = nodes.folder_of(started.data["workers"][-1]["node_id"])
    killed_at = time.time()
    nodes.kill_raylet(folder)
    dead.append(folder)  # its other processes are stopped at the end
    del nodes.nodes[folder]
    if kind == "fixed":
        nodes.add_node(1, {"slot": 1.0})  # the replacement, at once
    with contextlib.suppress(tm.JobFailed):  # said below
        job.wait(timeout=600, poll_interval=1)
    done = client.get(job.id).info
    if done.status is not tm.JobStatus.succeeded or len(done.attempts) != 1:
        raise RuntimeError(f"{kind}: {done.status.value} in {len(done.attempts)} attempt(s): {done.error}")
    groups = [e for e in client.events(job.id) if e.kind == "workers_started"]
    sizes = [e.data.get("num_workers") for e in groups]
    restarted = min(e.created_at.timestamp() for e in groups if e.created_at.timestamp() > killed_at)
    points = client.metrics(job.id, names=["loss"])
    after = [p for p in points if p.ts.timestamp() > restarted]
    before = [p.step or 0 for p in points if p.ts.timestamp() <= restarted and p.rank == 0]
    resumed = min(p.step or 0 for p in after if p.rank == 0)
    return {
        "recovery_s": min(p.ts.timestamp() for p in after) - killed_at,
        "group_restarted_s": restarted - killed_at,
        "steps_lost": max(before) - (resumed - 1) if len(set(sizes[-2:])) == 1 else None,
        "group_sizes": sizes,
    }


def main() -> None:
    args = parse_args(
        __doc__,
        ("--runs", 2, "measured runs of each kind"),
        ("--warmup", 0, "unmeasured runs of each kind first"),
        ("--after-checkpoints", 2, "checkpoints a run has before its node is killed"),
    )
    with run("recovery", args) as record, local_stack(record) as stack, stack.client() as client:
        nodes, dead = MultiNode(stack.head), list[Path]()  # worker nodes beside the stack's head, not theirs to stop
        try:
            runs = interleaved(
                tuple(KINDS), args.warmup, args.runs, lambda k, _n: one_run(client, nodes, dead, k, args)
            )
        finally:
            for folder in [*dead, *nodes.nodes]:
                nodes.stop_node(folder)
        record.tables["runs"] = [{"kind": kind, **row} for kind, rows in runs.items() for row in rows]
        medians = {kind: statistics.median(r["recovery_s"] for r in rows) for kind, rows in runs.items()}
        record.ratio("elastic gang: node lost to next step, median s", medians["elastic"],
                     "fixed gang with a replacement node", medians["fixed"])  # fmt: skip
        counted = {kind: [r["steps_lost"] for r in rows if r["steps_lost"] is not None] for kind, rows in runs.items()}
        lost = {kind: statistics.median(steps) if steps else None for kind, steps in counted.items()}
        record.tables["medians"] = [{"kind": k, "recovery_s": medians[k], "steps_lost": lost[k]} for k in KINDS]


if __name__ == "__main__":
    main()
