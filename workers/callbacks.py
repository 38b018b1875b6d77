"""What Ray Train's controller sees, forwarded to trainmaster.

Runs inside the TrainController actor (registered through RunConfig.callbacks), whose environment
carries the job's id like every other process of the job. The job token is not in that environment
(a launch carries only its claim, which the driver exchanged): `JobTokenCallback` brings it.

- `JobTokenCallback`: the driver's job token, set in the controller's environment as the callback is
  unpickled there, and in each worker's before its training function starts (an actor call, inside
  Ray: never in a runtime environment or train_loop_config, which Ray shows to every job).
- `TrainmasterCallback` (Ray's public `UserCallback`): reported metrics and checkpoints.
- `PlacementCallback` (Ray Train's controller and worker-group hooks, pinned with ray 2.60.*): when
  the gang waits for its placement group, which node each worker landed on (the event
  `workers_started` is also what moves the job from `starting` to `running`), and which workers and
  nodes were lost when Ray Train restarts the group.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from ray.train import UserCallback
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

import trainmaster
from trainmaster import safe_paths
from trainmaster.context import ENV_JOB_ID, ENV_JOB_TOKEN, ENV_STORAGE_PATH, post_event, record_checkpoint
from trainmaster.control import max_workers

MAX_LISTED_WORKERS = 64  # event data stays small for a gang of 1,024
RESIZED = "resized by Ray Train's elastic policy"
GREW = "room freed up: Ray Train's elastic policy grows the gang toward its maximum"
SHRUNK = "the platform asked it to shrink, to make room for a higher-priority job"
# Ray Train's running-group check found fewer workers' room than the group has, with no cap asking it:
# a node of the group stopped answering (workers/elastic.py probes them) before its workers were seen lost.
NODE_LOST = "worker(s) lost: their node stopped answering"
ROOM_AT_START = "Ray Train's elastic policy found room above the minimum it was admitted at"


def _set_job_token(token: str | None) -> None:
    if token:
        os.environ[ENV_JOB_TOKEN] = token


class JobTokenCallback(WorkerGroupCallback):
    def __init__(self, token: str | None) -> None:
        self.token = token

    def __setstate__(self, state: dict[str, Any]) -> None:  # unpickled in the controller actor
        self.__dict__.update(state)
        _set_job_token(self.token)

    def after_worker_group_start(self, worker_group: Any) -> None:
        worker_group.execute(_set_job_token, self.token)


class TrainmasterCallback(UserCallback):
    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        rank0 = metrics[0] if metrics else {}
        numbers = {k: float(v) for k, v in rank0.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        step = _step_of(rank0)
        if numbers:
            trainmaster.log({f"report/{k}": v for k, v in numbers.items()}, step=step)
        if checkpoint is not None:
            folder = Path(str(checkpoint.path))
            size = folder_bytes(folder)
            finite = {k: v for k, v in numbers.items() if math.isfinite(v)}
            if (refused := record_checkpoint(str(folder), step, finite, size)) is not None:
                removed = remove_refused(folder)
                print(f"[trainmaster] checkpoint {folder.name} {removed}: {refused}", file=sys.stderr, flush=True)


def folder_bytes(folder: Path) -> int | None:
    """The bytes of the files under a local checkpoint folder; None when it is not one (remote storage)."""
    if not folder.is_dir():
        return None
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def remove_refused(folder: Path) -> str:
    """Removes a checkpoint the API refused (over the project's storage quota; it lists it as deleted),
    only below this job's run folder, `<storage path>/<job id>/`, reached as the collector does
    (trainmaster/safe_paths.py: no link followed on the way, the run folder included); says what it did."""
    storage, job_id = os.environ.get(ENV_STORAGE_PATH, ""), os.environ.get(ENV_JOB_ID, "")
    if not (storage and job_id) or "://" in storage:
        return "refused and left in place (not in this job's storage folder)"
    try:
        (result,) = safe_paths.perform(storage, [safe_paths.Request("remove", str(folder), ((job_id,),))])
    except OSError as exc:  # the storage folder itself cannot be opened
        return f"refused and left in place ({exc})"
    if result.outcome == "removed":
        return "refused and removed"
    if result.outcome in ("linked", "not_a_folder"):
        return f"refused and left in place ({result.detail} is a link or not a folder: not this job's storage folder)"
    if result.outcome == "error":
        return f"refused and left in place ({result.detail})"
    if result.outcome == "gone":
        return "refused (its files were already gone)"
    return "refused and left in place (not in this job's storage folder)"


def _step_of(metrics: dict[str, Any]) -> int | None:
    for key in ("step", "epoch", "iteration"):
        value = metrics.get(key)
        if isinstance(value, int) and value >= 0:
            return value
    return None


# Ray Train's scaling policies, fixed and elastic, register each run's resources with Ray's autoscaling
# coordinator and renew the request every 20 s (AUTOSCALING_REQUESTS_INTERVAL_S). A run stopped from
# outside (preempted, cancelled, timed out: Ray Jobs' stop) never cancels it, and the coordinator keeps
# those resources reserved for AUTOSCALING_REQUESTS_EXPIRE_TIME_S, 180 s: an elastic gang started meanwhile
# is given nothing and waits. Tried: an elastic job admitted right after a preemption waited 2 minutes for
# its placement group. Three renewals' time lets a live run's request stand and a dead one's go in a minute.
REQUEST_EXPIRY_S = 60


def expire_requests_sooner() -> None:
    """In the controller's process, before its policy sends a request (the callbacks are unpickled as the
    controller actor is made)."""
    from ray.train.v2._internal.execution.scaling_policy import autoscaling_coordinator_client as coordinator

    coordinator.AUTOSCALING_REQUESTS_EXPIRE_TIME_S = min(
        coordinator.AUTOSCALING_REQUESTS_EXPIRE_TIME_S, REQUEST_EXPIRY_S
    )


class PlacementCallback(ControllerCallback, WorkerGroupCallback):
    def __setstate__(self, state: dict[str, Any]) -> None:  # unpickled in the controller actor
        self.__dict__.update(state)
        expire_requests_sooner()

    def __init__(self, admitted: int = 0) -> None:
        self.node_of_rank: dict[int, dict[str, str]] = {}
        self.group_starts = 0
        # Workers in the group that started last; before the first, what admission accounted (an
        # elastic gang's min), so a first group Ray Train started larger is a resize too.
        self.size = admitted
        self.nodes: set[str] = set()  # and the nodes they ran on
        self.why = ""  # what ended that group: a loss, or Ray Train's elastic policy growing it

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        kind = type(current_state).__name__
        if kind == "SchedulingState" and self.group_starts == 0:
            decision = getattr(current_state, "scaling_decision", None)
            workers = getattr(decision, "num_workers", None)
            resources = getattr(decision, "resources_per_worker", None)
            post_event(
                "gang_pending",
                f"waiting for a placement group of {workers} x {resources}",
                {"num_workers": workers, "resources_per_worker": resources},
            )
        elif kind in ("RestartingState", "ReschedulingState", "ErroredState"):
            error = getattr(current_state, "training_failed_error", None)
            if error is not None:
                message, data = lost_workers(error, self.node_of_rank, restarts=kind != "ErroredState")
                post_event("workers_lost", message, data)
                self.why = f"worker rank(s) {data['ranks']} lost" if data["ranks"] else "worker(s) lost"
        elif kind == "ResizingState":
            self.why = RESIZED

    def after_worker_group_start(self, worker_group: Any) -> None:
        self.group_starts += 1
        workers = [describe_worker(worker) for worker in worker_group.get_workers()]
        before, self.node_of_rank = self.node_of_rank, {w["rank"]: w for w in workers if isinstance(w.get("rank"), int)}
        nodes = sorted({w["node"] for w in workers})
        restart = f" (restart {self.group_starts - 1})" if self.group_starts > 1 else ""
        post_event(
            "workers_started",
            f"{len(workers)} worker(s) on {len(nodes)} node(s): {', '.join(nodes)}{restart}",
            {"workers": workers[:MAX_LISTED_WORKERS], "num_workers": len(workers), "nodes": nodes},
        )
        if self.size and len(workers) != self.size:
            # The API moves what the job holds to the new size (api/jobs/service.py, add_event).
            first = self.group_starts == 1  # larger than admission accounted: Ray Train found room
            why = self.why or (ROOM_AT_START if first else "Ray Train restarted the group")
            if why == RESIZED:  # Ray Train's elastic policy (workers/elastic.py) decided it
                cap = max_workers()
                asked = cap is not None and cap < self.size
                why = GREW if len(workers) > self.size else SHRUNK if asked else NODE_LOST
            gone = sorted(self.nodes - set(nodes))  # the group's nodes that the new one is without
            if why == NODE_LOST:  # no health-check failure was seen: say which workers went
                ranks = sorted(rank for rank, worker in before.items() if worker["node"] in gone)
                post_event("workers_lost", *lost_event(ranks, gone, "their node stopped answering", restarts=True))
            if gone:
                why += f" on node(s) {', '.join(gone)}"
            post_event(
                "resized",
                f"{self.size} -> {len(workers)} workers: {why}",
                {"from": self.size, "to": len(workers), "why": why},
            )
        self.size, self.nodes, self.why = len(workers), set(nodes), ""


def describe_worker(worker: Any) -> dict[str, Any]:
    metadata = worker.metadata
    context = worker.distributed_context
    return {
        "node": f"{metadata.node_ip}/{metadata.node_id[:8]}",
        "rank": getattr(context, "world_rank", None),
        "node_rank": getattr(context, "node_rank", None),
        "node_id": metadata.node_id,
        "node_ip": metadata.node_ip,
        "hostname": metadata.hostname,
        "pid": metadata.pid,
        "gpu_ids": [str(g) for g in metadata.gpu_ids],
    }


def lost_workers(error: Any, node_of_rank: dict[int, dict[str, Any]], *, restarts: bool) -> tuple[str, dict[str, Any]]:
    """The event text for a failed worker group: which ranks failed, on which nodes, and why."""
    failures = getattr(error, "worker_failures", None) or {}
    ranks = sorted(int(rank) for rank in failures)
    nodes = sorted({node_of_rank[rank]["node"] for rank in ranks if rank in node_of_rank})
    first = str(next(iter(failures.values()), error) or "").strip().splitlines()
    return lost_event(ranks, nodes, first[-1][:300] if first else "unknown", restarts=restarts)


def lost_event(ranks: list[int], nodes: list[str], reason: str, *, restarts: bool) -> tuple[str, dict[str, Any]]:
    """A `workers_lost` event's text and data, however the loss was seen: a worker's failure
    (`lost_workers`), or a node gone from the elastic policy's count before any worker failed."""
    where = f" on node(s) {', '.join(nodes)}" if nodes else ""
    then = "Ray Train restarts the group" if restarts else "no failures left (max_failures): the attempt fails"
    message = f"worker rank(s) {ranks or '?'} failed{where}: {reason}; {then}"
    return message, {"ranks": ranks, "nodes": nodes, "error": reason, "restarts": restarts}
