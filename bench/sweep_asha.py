"""An ASHA sweep through trainmaster against the full grid, and Ray Tune's ASHA on the same trials.

The objective is `builtin:toy-curve` (workers/templates/toy_curve.py): a deterministic noisy learning
curve `toy_loss(lr, hidden, dropout, step)`, logged every step after sleeping `--step-s` seconds. The
grid: lr {1e-4..1e-1} x hidden {32, 64, 128} x dropout {0, 0.25, 0.5}, 36 trials of `--steps`, its best
final loss from the pure objective. trainmaster: on its own `trainmaster up`, `client.sweep(...)` of
`--trials` trials sampled with each of `--seeds`, ASHA (`--grace`, `--rf`), `--max-concurrent` at once;
steps used are the sum of each trial's last stored step. The peer, after the stack is down: Ray Tune's
`ASHAScheduler` on the same sampled trials with the same rungs, concurrency, CPU and step time, on a
local Ray. A sweep reaches the grid when a trial trained to the end is at or below the grid's best
final loss; the target is to reach it with at most 40% of the grid's steps.

    .venv/bin/python bench/sweep_asha.py [--seeds 0 1 2] [--trials 36] [--steps 36] [--step-s 1.0]
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from typing import Any

from harness import load_1m, local_stack, parse_args, run

import trainmaster as tm
from workers.templates.toy_curve import toy_loss

GRID: dict[str, list[float]] = {"lr": [1e-4, 1e-3, 1e-2, 1e-1], "hidden": [32, 64, 128], "dropout": [0.0, 0.25, 0.5]}
SPACE = {"lr": {"log_uniform": [1e-4, 1e-1]}, "hidden": {"values": [32, 64, 128]}, "dropout": {"uniform": [0, 0.5]}}
TARGET_FRACTION = 0.40


def grid_figures(steps: int) -> dict[str, Any]:
    finals = {(lr, h, d): toy_loss(lr, h, d, steps) for lr, h, d in itertools.product(*GRID.values())}
    best = min(finals, key=lambda combo: finals[combo])
    best_params = dict(zip(GRID, best, strict=True))
    return {"trials": len(finals), "steps": len(finals) * steps, "best_final": finals[best], "best_params": best_params}


def summary(name: str, seed: int, trials: list[dict[str, Any]], steps: int, grid: dict[str, Any]) -> dict[str, Any]:
    used = sum(t["steps"] for t in trials)
    finished = [t for t in trials if t["steps"] >= steps and t["final"] is not None]
    best = min(finished, key=lambda t: t["final"]) if finished else {"final": None, "params": None}
    reached = best["final"] is not None and best["final"] <= grid["best_final"]
    return {"sweep": name, "seed": seed, "trials": len(trials), "trained_to_end": len(finished), "steps_used": used,
            "fraction_of_grid_steps": used / grid["steps"], "best_final": best["final"],
            "grid_best_final": grid["best_final"], "reached": reached,
            "within_target": used / grid["steps"] <= TARGET_FRACTION, "best_params": best["params"]}


def trainmaster_sweep(client: tm.Client, args: Any, seed: int) -> tuple[list[dict[str, Any]], float]:
    spec = tm.JobSpec(name="toy", entrypoint="builtin:toy-curve", config={"steps": args.steps, "step_s": args.step_s},
                      scaling=tm.Scaling(num_workers=1, resources_per_worker={"CPU": args.cpus}))
    began = time.monotonic()
    asha = {"policy": "asha", "grace_steps": args.grace, "reduction_factor": args.rf}
    sweep = client.sweep(spec, name=f"bench-asha-{seed}", parameters=SPACE, metric="loss", max_trials=args.trials,
                         max_concurrent=args.max_concurrent, early_stopping=asha, seed=seed)
    print(f"sweep {sweep.id} (seed {seed}) started", flush=True)
    done = sweep.wait(timeout=3600, poll_interval=2)
    wall = time.monotonic() - began
    trials = []
    for trial in sorted(done.trials, key=lambda t: t.n):
        points = [p for p in client.metrics(trial.job_id, names=["loss"]) if p.step is not None and p.rank == 0]
        last = max(points, key=lambda p: p.step or 0) if points else None
        steps, final = (int(last.step or 0), last.value) if last else (0, None)
        row = {"n": trial.n, "params": trial.params, "steps": steps, "final": final}
        trials.append(row | {"status": trial.status, "reason": trial.stopped_reason})
    return trials, wall


def ray_tune_sweep(params: list[dict[str, Any]], args: Any) -> tuple[list[dict[str, Any]], float]:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    steps, step_s = args.steps, args.step_s

    def trainable(config: dict[str, Any]) -> None:
        p = params[config["trial"]]
        for step in range(1, steps + 1):
            time.sleep(step_s)
            tune.report({"loss": toy_loss(p["lr"], p["hidden"], p["dropout"], step)})

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private cluster: no token file written to ~/.ray
    ray.init(address="local", num_cpus=args.max_concurrent * args.cpus, include_dashboard=False, log_to_driver=False)
    try:
        began = time.monotonic()
        asha = ASHAScheduler(time_attr="training_iteration", max_t=steps, grace_period=args.grace,
                             reduction_factor=args.rf)
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": args.cpus}),
            param_space={"trial": tune.grid_search(list(range(len(params))))},
            tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=asha,
                                        max_concurrent_trials=args.max_concurrent),
            run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="tm-bench-tune-"), verbose=0),
        )
        results = tuner.fit()
        wall = time.monotonic() - began
    finally:
        ray.shutdown()
    trials = []
    for result in (results[index] for index in range(len(results))):
        n, metrics = int((result.config or {})["trial"]), result.metrics or {}
        steps = int(metrics.get("training_iteration", 0))
        trials.append({"n": n, "params": params[n], "steps": steps, "final": metrics.get("loss")})
    return sorted(trials, key=lambda t: t["n"]), wall


def main() -> None:
    args = parse_args(
        __doc__,
        ("--seeds", [0, 1, 2], "sampling seeds, one sweep each"),
        ("--trials", 36, "trials per sweep"),
        ("--steps", 36, "training steps of a trial that is never stopped"),
        ("--step-s", 1.0, "seconds per step"),
        ("--grace", 2, "ASHA grace period in steps"),
        ("--rf", 3, "ASHA reduction factor"),
        ("--max-concurrent", 4, "trials at once"),
        ("--cpus", 0.5, "CPU per trial (the toy mostly sleeps)"),
        ("--poll-s", 0.5, "the dispatcher's poll interval (its sweep round)"),
    )
    grid = grid_figures(args.steps)
    os.environ["TRAINMASTER_POLL_INTERVAL_S"] = str(args.poll_s)  # the stack's dispatcher inherits it
    with run("sweep_asha", args) as record:
        rows: list[dict[str, Any]] = []
        sampled: dict[int, list[dict[str, Any]]] = {}

        def sweep(name: str, seed: int, trials: list[dict[str, Any]], wall: float) -> None:
            rows.append(summary(name, seed, trials, args.steps, grid) | {"wall_s": round(wall, 1)})
            record.tables[f"{name} trials, seed {seed}"] = trials
            print(rows[-1], flush=True)

        with local_stack(record) as stack, stack.client() as client:
            for seed in args.seeds:
                trials, wall = trainmaster_sweep(client, args, seed)
                sampled[seed] = [t["params"] for t in trials]
                sweep("trainmaster", seed, trials, wall)
        for seed in args.seeds:
            sweep("ray tune", seed, *ray_tune_sweep(sampled[seed], args))
        record.tables["grid"] = [grid]
        record.tables["sweeps"] = rows
        for seed in args.seeds:
            by_sweep = {row["sweep"]: row for row in rows if row["seed"] == seed}
            ours, peer = by_sweep["trainmaster"], by_sweep["ray tune"]
            figure = f"seed {seed}: grid steps used by trainmaster ASHA"
            record.ratio(figure, ours["fraction_of_grid_steps"], "full grid", 1.0)
            figure = f"seed {seed}: steps used by trainmaster ASHA"
            record.ratio(figure, ours["steps_used"], "Ray Tune ASHA", peer["steps_used"])
        record.facts["load_1m_after_sweeps"] = load_1m()


if __name__ == "__main__":
    main()
