"""Recovery from a lost node: a fixed gang against an elastic one, side by side in one run (issue 29).

A local stack (`trainmaster up`) and two worker nodes of one `slot` each: a gang of two workers
(`resources_per_worker: {CPU: 0.5, slot: 1}`, SPREAD) has one worker per node. `builtin:mlp` trains
with a checkpoint every epoch; after `--after-checkpoints` checkpoints the raylet of one worker's node is
SIGKILLed, as a machine that dies would leave it. Measured from the kill, per run:

- to the next training step: the first `loss` point logged by the group Ray Train started after the kill
  (points the surviving worker logged before it noticed are not training resumed);
- steps lost: the steps rank 0 had logged past the checkpoint the new group resumes from (across a
  restart at the same size only: a step is a batch per worker, so their count per epoch follows the size).

    fixed    `num_workers: 2`, `max_failures: 1`: Ray Train restarts the whole group from its checkpoint
             once two slots are free again: a replacement node joins at once (the best case for it)
    elastic  `num_workers: {min: 1, max: 2}`: Ray Train restarts the group on what is left, at once; the
             replacement joins after the job ends (for the next run)

The figure is elastic / fixed; runs alternate (`--runs` of each, after `--warmup`).

    .venv/bin/python bench/recovery.py [--runs 2] [--warmup 0] [--after-checkpoints 2]
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import Stack, interleaved, local_stack, parse_args, run, wait_until

import trainmaster as tm
from api.stack import ray_head
from api.stack.processes import matching

CONFIG = {"epochs": 8, "samples": 2048, "batch_size": 64, "epoch_sleep_s": 1.5}
SCALING = {"resources_per_worker": {"CPU": 0.5, "slot": 1}, "placement_strategy": "SPREAD"}
KINDS: dict[str, dict[str, Any]] = {"fixed": {"num_workers": 2}, "elastic": {"num_workers": {"min": 1, "max": 2}}}


class Nodes:
    """The stack's worker nodes of one `slot` each (as `trainmaster join` adds them), by Ray node id."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.folders: dict[str, Path] = {}
        self.dead: list[Path] = []  # killed: their other processes are stopped at the end

    def ids(self, client: tm.Client) -> set[str]:
        return {node.node_id for node in client.cluster().nodes}

    def add(self, client: tm.Client) -> None:
        before = self.ids(client)
        folder = Path(tempfile.mkdtemp(prefix="tmb-node-", dir="/tmp"))
        ray_head.join(self.stack.ray_gcs, self.stack.home / "ray_auth_token", folder / "ray", num_cpus=1,
                      num_gpus=0, resources={"slot": 1.0}, log_path=folder / "join.log")  # fmt: skip
        wait_until(lambda: len(self.ids(client) - before) == 1, "a node to join")
        [node] = self.ids(client) - before
        self.folders[node] = folder

    def kill(self, node: str) -> None:
        """SIGKILL the node's raylet; the rest of it is stopped with the others at the end."""
        folder = self.folders.pop(node)
        self.dead.append(folder)
        for pid in matching([re.escape(str(folder))]):
            if "raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"):
                os.kill(pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for folder in [*self.folders.values(), *self.dead]:
            ray_head.stop(folder / "ray")
        self.folders.clear()


def one_run(client: tm.Client, nodes: Nodes, kind: str, args: Any) -> dict[str, Any]:
    for _ in range(2 - len(nodes.folders)):
        nodes.add(client)
    scaling = tm.Scaling.model_validate({**SCALING, **KINDS[kind]})
    job = client.submit(name=f"recovery-{kind}", entrypoint="builtin:mlp", scaling=scaling, config=CONFIG,
                        max_failures=1 if kind == "fixed" else 0)  # fmt: skip
    wait_until(lambda: len(client.checkpoints(job.id)) >= args.after_checkpoints, "checkpoints", 300)
    started = [e for e in client.events(job.id) if e.kind == "workers_started"][-1]
    victim = started.data["workers"][-1]["node_id"]
    killed_at = time.time()
    nodes.kill(victim)
    if kind == "fixed":
        nodes.add(client)  # the replacement, at once
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
        # Rank 0's steps per epoch follow the gang's size: counted only across a restart at the same size.
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
        nodes = Nodes(stack)
        try:
            runs = interleaved(
                tuple(KINDS), args.warmup, args.runs, lambda kind, _n: one_run(client, nodes, kind, args)
            )
        finally:
            nodes.stop_all()
        record.tables["runs"] = [{"kind": kind, **row} for kind, rows in runs.items() for row in rows]
        medians = {kind: statistics.median(r["recovery_s"] for r in rows) for kind, rows in runs.items()}
        record.ratio("elastic gang: node lost to next step, median s", medians["elastic"],
                     "fixed gang with a replacement node", medians["fixed"])  # fmt: skip
        counted = {kind: [r["steps_lost"] for r in rows if r["steps_lost"] is not None] for kind, rows in runs.items()}
        lost = {kind: statistics.median(steps) if steps else None for kind, steps in counted.items()}
        record.tables["medians"] = [{"kind": k, "recovery_s": medians[k], "steps_lost": lost[k]} for k in KINDS]


if __name__ == "__main__":
    main()
