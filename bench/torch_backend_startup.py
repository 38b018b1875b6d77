"""`fit()` to first step with Ray's `TorchTrainer` against trainmaster's torch-free control side.

Both run the same 2-worker gloo function (bench/first_step_job.py: rank stamps, then all-reduces) on
one Ray head started by the script, from one connected driver, interleaved, every CPU free before
each run. The peer is `ray.train.torch.TorchTrainer(torch_config=TorchConfig(backend="gloo"))`; ours
is `workers.lean_torch.lean_torch_trainer(torch_config=LeanTorchConfig(backend="gloo"))`, which sets
up the same process group with Ray's own worker-side functions but never imports torch in the driver
or in the Ray Train controller. The driver's own import of each trainer is timed in a fresh
interpreter, since this script's driver has both loaded after the first run.

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

from first_step_job import fit
from harness import REPO, interleaved, parser, ray_head, run, wait_until

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


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=5, help="measured runs of each path")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each path first")
    p.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    args = p.parse_args()
    with run("torch_backend_startup", args) as record, tempfile.TemporaryDirectory(prefix="tmtb-") as tmp:
        imports = {path: [import_seconds(statement) for _ in range(3)] for path, statement in IMPORTS.items()}
        with ray_head(args.workers) as head:
            import ray

            os.environ.update(head.env)
            # The workers import first_step_job and workers.lean_torch by name, as the driver does.
            env = {"env_vars": {"PYTHONPATH": f"{REPO}:{REPO / 'bench'}"}}
            ray.init(head.gcs_address, runtime_env=env, log_to_driver=False, logging_level=logging.WARNING)
            try:

                def idle() -> bool:
                    cpus = head.cpus()  # (used, total); None while the head does not answer
                    return cpus is not None and cpus[0] <= 0

                def one(path: str, n: int) -> dict[str, Any]:
                    wait_until(idle, "Ray CPUs still in use", every_s=0.25)
                    stamp = Path(tmp) / f"{path}-{n}.txt"
                    return fit(functools.partial(trainer, path), path, args.workers, stamp, Path(tmp) / "storage")

                runs = interleaved(("TorchTrainer", "lean"), args.warmup, args.runs, one)
            finally:
                ray.shutdown()
        record.tables["driver import, fresh interpreter (median of 3)"] = [
            {"trainer": path, "s": statistics.median(values)} for path, values in imports.items()
        ]
        record.tables["fit"] = [
            {
                "trainer": path,
                "runs": len(rows),
                "first_step_median_s": statistics.median(r["first_step_s"] for r in rows),
                "fit_median_s": statistics.median(r["fit_s"] for r in rows),
                "min_first_step_s": min(r["first_step_s"] for r in rows),
                "max_first_step_s": max(r["first_step_s"] for r in rows),
            }
            for path, rows in runs.items()
        ]
        peer, ours = record.tables["fit"]
        for figure, key in (("fit() to first step", "first_step_median_s"), ("whole fit()", "fit_median_s")):
            record.ratio(f"lean: {figure}, median s", ours[key], "TorchTrainer", peer[key])
        driver_imports = record.tables["driver import, fresh interpreter (median of 3)"]
        record.ratio("lean: driver import, s", driver_imports[1]["s"], "TorchTrainer", driver_imports[0]["s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
