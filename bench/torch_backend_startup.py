"""`fit()` to first step with Ray's `TorchTrainer` against trainmaster's torch-free control side.

Both run the same 2-worker gloo function (`first_step` of bench/train_jobs.py) on one Ray head started
by the script, from one connected driver, interleaved, every CPU free before each run. The peer is
`ray.train.torch.TorchTrainer(torch_config=TorchConfig(backend="gloo"))`; ours is
`workers.lean_torch.lean_torch_trainer(torch_config=LeanTorchConfig(backend="gloo"))`: the same process
group, set up with Ray's own worker-side functions, but no torch import in the driver or in the Ray Train
controller. The driver's import of each trainer is timed in a fresh interpreter (this driver has both
loaded after the first run).

    .venv/bin/python bench/torch_backend_startup.py [--runs 5] [--warmup 1] [--workers 2]
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import REPO, RUNS, interleaved, median, parse_args, ray_head, run, wait_until
from train_jobs import fit

IMPORTS = {
    "TorchTrainer": "from ray.train.torch import TorchTrainer, TorchConfig",
    "lean": "from workers.lean_torch import lean_torch_trainer, LeanTorchConfig; "
    "from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer",
}


def import_seconds(statement: str) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return float(done.stdout.strip())


def trainer(path: str, **kwargs: Any) -> Any:
    if path == "TorchTrainer":
        from ray.train.torch import TorchConfig, TorchTrainer

        return TorchTrainer(torch_config=TorchConfig(backend="gloo"), **kwargs)
    from workers.lean_torch import LeanTorchConfig, lean_torch_trainer

    return lean_torch_trainer(torch_config=LeanTorchConfig(backend="gloo"), **kwargs)


def main() -> None:
    args = parse_args(__doc__, *RUNS)
    with run("torch_backend_startup", args) as record, tempfile.TemporaryDirectory(prefix="tmtb-") as tmp:
        imports = {path: statistics.median(import_seconds(code) for _ in range(3)) for path, code in IMPORTS.items()}
        with ray_head(args.workers) as head:
            os.environ.update(head.env)  # before Ray's import, which reads its auth mode once
            import ray

            # The workers import train_jobs and workers.lean_torch by name, as the driver does.
            env = {"env_vars": {"PYTHONPATH": f"{REPO}:{REPO / 'bench'}"}}
            ray.init(head.gcs_address, runtime_env=env, log_to_driver=False, logging_level=logging.WARNING)

            def one(path: str, n: int) -> dict[str, Any]:
                # (used, total) CPUs; None while the head does not answer
                wait_until(
                    lambda: (cpus := head.cpus()) is not None and cpus[0] <= 0, "Ray CPUs still in use", every_s=0.25
                )
                stamp = Path(tmp) / f"{path}-{n}.txt"
                return fit(functools.partial(trainer, path), path, args.workers, stamp, Path(tmp) / "storage")

            try:
                runs = interleaved(("TorchTrainer", "lean"), args.warmup, args.runs, one)
            finally:
                ray.shutdown()
        imported = [{"trainer": path, "s": seconds} for path, seconds in imports.items()]
        record.tables["driver import, fresh interpreter (median of 3)"] = imported
        peer, ours = record.tables["fit"] = [
            {
                "trainer": path,
                "runs": len(rows),
                "first_step_median_s": median(rows, "first_step_s"),
                "fit_median_s": median(rows, "fit_s"),
                "min_first_step_s": min(r["first_step_s"] for r in rows),
                "max_first_step_s": max(r["first_step_s"] for r in rows),
            }
            for path, rows in runs.items()
        ]
        for figure, key in (("fit() to first step", "first_step_median_s"), ("whole fit()", "fit_median_s")):
            record.ratio(f"lean: {figure}, median s", ours[key], "TorchTrainer", peer[key])
        record.ratio("lean: driver import, s", imports["lean"], "TorchTrainer", imports["TorchTrainer"])


if __name__ == "__main__":
    main()
