"""The Ray job's entrypoint: `python -m workers.driver --job-id ID --attempt N`.

Built by the dispatcher, never taken from the user. Reads the JobSpec from the environment, builds the
Ray trainer of its framework (`TorchTrainer` by default; workers/frameworks/ has one module each) and
runs it. A run with the same name and storage path resumes from its latest
checkpoint, so a retry (a new attempt) continues where the last one stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

import trainmaster
from trainmaster import json_logs
from trainmaster.context import (
    ENV_ELASTIC_RESIZE_S,
    ENV_LABEL_SELECTOR,
    ENV_WORKER_RANK,
    ClaimRefused,
    JobContext,
    post_event,
)
from trainmaster.models import JobSpec
from workers import entrypoints, frameworks, job_output, run_snapshot, system_metrics, warm
from workers.collectives.timeout import collective_timeout_s, explain_failure


def storage_path(context: JobContext) -> str:
    raw = context.storage_path
    if "://" in raw:
        return raw
    path = Path(raw).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


ELASTIC_RESTARTS = 3  # an elastic gang's group restarts (smaller) after lost workers, when max_failures is 0


def admitted(spec: JobSpec) -> int:
    """The gang size admission accounted: an elastic gang's minimum (its first group may start larger,
    a resize the API must hear of), 0 for a fixed gang (its size never changes)."""
    return spec.scaling.min_workers if spec.scaling.elastic else 0


def failures_allowed(spec: JobSpec) -> int:
    """Ray Train's max_failures: the job's; an elastic gang that left it 0 restarts smaller instead of
    failing its attempt on the first lost worker, ELASTIC_RESTARTS times."""
    return spec.max_failures or (ELASTIC_RESTARTS if spec.scaling.elastic else 0)


def ray_scaling(spec: JobSpec) -> dict[str, Any]:
    """Ray Train's ScalingConfig (v2's: mypy knows v1's, hence a dict) for the job's gang."""
    scaling = spec.scaling
    return {
        # an elastic gang ({min, max}): Ray Train's elastic policy between the two
        "num_workers": (scaling.min_workers, scaling.max_workers) if scaling.elastic else scaling.min_workers,
        "elastic_resize_monitor_interval_s": float(os.environ.get(ENV_ELASTIC_RESIZE_S, "60")),
        "use_gpu": spec.uses_gpu,
        "resources_per_worker": scaling.worker_resources(),
        "placement_strategy": scaling.placement_strategy.value,
        # scaling.topology: the node-label domain admission chose (api/dispatcher/placement.py)
        "label_selector": label_selector(),
    }


def label_selector() -> dict[str, str] | None:
    """The node labels every worker must carry: the domain admission placed a gang with a topology in."""
    raw = os.environ.get(ENV_LABEL_SELECTOR)
    return {str(k): str(v) for k, v in json.loads(raw).items()} if raw else None


def train_worker(config: dict[str, Any]) -> Any:
    """What every Ray Train worker runs: record where it runs, then the user's training code."""
    import ray.train

    from workers.gpu import describe_device

    tm = config.pop("_trainmaster")
    job_output.print_once()
    job = JobContext.from_env()
    job_output.quiet_platform_requests(job.api_url if job else None)
    framework = frameworks.require(tm["framework"])
    script = tm["mode"] == "script"
    framework.prepare(script)
    context = ray.train.get_context()
    os.environ[ENV_WORKER_RANK] = str(context.get_world_rank())  # trainmaster.log's rank, any framework
    if context.get_world_rank() == 0:
        device = describe_device()
        seen = framework.runtime()
        post_event(
            "runtime",
            f"{tm['framework']} on {seen['world_size']} worker(s), backend {seen['backend']}, {device['device']}",
            {"framework": tm["framework"], **seen, **device},
        )
        resumed = ray.train.get_checkpoint()
        if resumed is not None:
            post_event("resumed", f"resuming from checkpoint {resumed.path}", {"checkpoint": str(resumed.path)})
    stop_sampling = threading.Event()
    system_metrics.start(stop_sampling)
    try:
        if script:
            return framework.run_script(entrypoints.script_path(tm["script"]), tm["args"])
        return entrypoints.resolve(tm["entrypoint"])(config)
    finally:
        stop_sampling.set()
        trainmaster.flush()


def build_trainer(spec: JobSpec, context: JobContext) -> Any:
    """The framework's Ray trainer (workers/frameworks/) with the gang, storage and callbacks of every job."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from workers import elastic
    from workers.callbacks import JobTokenCallback, PlacementCallback, TrainmasterCallback

    framework = frameworks.require(spec.framework)  # fail here, naming the install line, not in every worker
    if spec.entrypoint.startswith("script:"):
        tm = {
            "mode": "script",
            "script": spec.entrypoint.removeprefix("script:"),
            "args": list(spec.args),
        }
    else:
        entrypoints.resolve(spec.entrypoint)  # fail here, with a clear message, not in every worker
        tm = {"mode": "function", "entrypoint": spec.entrypoint}
    tm["framework"] = spec.framework.value
    storage = storage_path(context)
    if spec.scaling.elastic:
        elastic.install()  # the platform may ask the gang to shrink (preemption): workers/elastic.py
    # On local storage the dispatcher's collector deletes what the policy, pins and retention leave
    # (api/dispatcher/checkpoint_collector.py), and marks it in the API; Ray deleting too would remove pinned or
    # best checkpoints. On remote storage Ray's own num_to_keep deletes.
    ray_keeps = spec.checkpoint.num_to_keep if "://" in storage else None
    # The run's snapshot may list checkpoints deleted since (Ray would not start the run): pruned first.
    if "://" not in storage and (gone := run_snapshot.prune(Path(storage) / context.job_id)):
        print(
            f"[trainmaster] checkpoints deleted since the last attempt, not resumed from: {', '.join(gone)}",
            flush=True,
        )
    return without_idle_actors(
        framework.trainer(
            spec,
            train_fn=train_worker,
            config={**spec.config, "_trainmaster": tm},
            scaling=ScalingConfig(**ray_scaling(spec)),
            run=RunConfig(
                name=context.job_id,
                storage_path=storage,
                failure_config=FailureConfig(max_failures=failures_allowed(spec)),
                checkpoint_config=CheckpointConfig(num_to_keep=ray_keeps),
                # JobTokenCallback first: the controller and the workers hold the job token before anything reports
                callbacks=[JobTokenCallback(context.token), TrainmasterCallback(), PlacementCallback(admitted(spec))],  # type: ignore[list-item]
            ),
        )
    )


# Ray Train's default controller callbacks that start an actor (a Ray worker process, about 1.5 CPU s
# to start and import) which a trainmaster job does not use: the Ray Data manager, when the run has no
# Ray Datasets; the detached placement-group cleaner, which polls the state API every second for the
# controller's death. A trainmaster job's controller is an actor of its driver's Ray job, whose
# placement groups Ray removes when that job ends, and the dispatcher stops the Ray job of every
# attempt it ends, so the cleaner has nothing to do that Ray does not do.
IDLE_ACTOR_CALLBACKS = ("DatasetsCallback", "PlacementGroupCleanerCallback")


def without_idle_actors(trainer: Any) -> Any:
    """`trainer`, whose `fit()` leaves out the callbacks of IDLE_ACTOR_CALLBACKS (Datasets only when it
    has none). A Ray release without that hook is left as it is."""
    defaults = getattr(trainer, "_create_default_callbacks", None)
    if defaults is None:
        return trainer

    def lean() -> list[Any]:
        dropped = set(IDLE_ACTOR_CALLBACKS) - ({"DatasetsCallback"} if getattr(trainer, "datasets", None) else set())
        return [callback for callback in defaults() if type(callback).__name__ not in dropped]

    trainer._create_default_callbacks = lean
    return trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.driver")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    args = parser.parse_args(argv)
    json_logs.configure_logger("trainmaster.driver")  # not the root: the job's code may set that up
    job_output.keep_each_workers_lines()
    context = JobContext.from_env()
    if context is None or not context.spec_json:
        print("[trainmaster] error: the driver runs only as a trainmaster job (no job spec in its environment)")
        return 2
    spec = JobSpec.model_validate_json(context.spec_json)
    job_output.quiet_platform_requests(context.api_url)
    print(f"[trainmaster] job {args.job_id} attempt {args.attempt}: {spec.entrypoint}", flush=True)
    try:
        context = context.claimed()  # the job token for the launch's single-use claim, before any report
    except (ClaimRefused, httpx.HTTPError) as exc:
        print(
            f"[trainmaster] error: this attempt cannot report to the API, so it stops: {exc}. "
            "A claim is refused when it was used already (another process holds this job's token) "
            "or when the attempt started later than launch_timeout_s + starting_timeout_s.",
            file=sys.stderr,
            flush=True,
        )
        return 2
    threading.Thread(target=_report_driver_up, name="driver-up", daemon=True).start()
    started = time.monotonic()
    try:
        result = build_trainer(spec, context).fit()
    except entrypoints.EntrypointError as exc:
        print(f"[trainmaster] error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:
        traceback.print_exc()
        print(f"[trainmaster] error: training failed: {_root_cause(exc)}", file=sys.stderr, flush=True)
        return 1
    if result.error is not None:
        print(f"[trainmaster] error: training failed: {_root_cause(result.error)}", file=sys.stderr, flush=True)
        return 1
    print(
        f"[trainmaster] finished in {time.monotonic() - started:.1f} s; metrics {result.metrics}; "
        f"checkpoint {result.checkpoint.path if result.checkpoint else None}",
        flush=True,
    )
    return 0


def _report_driver_up() -> None:
    """Event `driver`: the job's driver is up, after how much Python start-up and import time, and
    whether it was forked warm (workers/warm/) or started cold, and why.

    One of the start-up milestones (admitted, driver, gang_pending, workers_started, runtime) that
    say where a job's start-up time goes; off the main thread, so fit() does not wait for it."""
    start = json.loads(os.environ.get(warm.ENV_START) or "{}")
    up_s = time.time() - float(start.get("started_at") or warm.started_at())
    how = "forked by the warm server" if start.get("warm") else f"cold: {start.get('reason') or 'started directly'}"
    post_event(
        "driver",
        f"driver up after {up_s:.1f} s of Python start-up and imports ({how})",
        {"startup_s": round(up_s, 3), "warm": bool(start.get("warm")), "cold_reason": start.get("reason")},
    )


def _root_cause(exc: BaseException) -> str:
    """The innermost error, the one a person can act on, in one line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    cause = f"{type(exc).__name__}: {text[-1] if text else ''}"
    return explain_failure(cause, collective_timeout_s(), full_text=str(exc))


if __name__ == "__main__":
    sys.exit(main())
