"""TensorFlow: Ray Train's `TensorflowTrainer`, which writes `TF_CONFIG` into every worker, so
`tf.distribute.MultiWorkerMirroredStrategy()` finds the whole gang (functions and scripts alike)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from workers import entrypoints

PACKAGE = "tensorflow"
INSTALL = "pip install 'trainmaster[tensorflow]'"


def trainer(spec: Any, *, train_fn: Any, config: dict[str, Any], scaling: Any, run: Any) -> Any:
    from ray.train.tensorflow import TensorflowTrainer  # imports tensorflow: missing → ModuleNotFoundError

    return TensorflowTrainer(
        train_loop_per_worker=train_fn, train_loop_config=config, scaling_config=scaling, run_config=run
    )


def _tf_config() -> dict[str, Any]:
    return dict(json.loads(os.environ.get("TF_CONFIG") or "{}"))


def runtime() -> dict[str, Any]:
    cluster = _tf_config().get("cluster", {}).get("worker", [])
    return {"backend": "TF_CONFIG (MultiWorkerMirroredStrategy)", "world_size": len(cluster)}


def _keras_as_installed() -> None:
    """Ray's TensorFlow backend sets TF_USE_LEGACY_KERAS=1, which makes `tf.keras` import the separate
    `tf_keras` package (Keras 2); without it TF 2.16+ fails on `tf.keras`. Keep Keras 3 then, unless
    the job set the variable itself."""
    import importlib.util

    from trainmaster.context import JobContext

    context = JobContext.from_env()
    asked = context is not None and "TF_USE_LEGACY_KERAS" in _job_env(context)
    if not asked and importlib.util.find_spec("tf_keras") is None:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)


def _job_env(context: Any) -> dict[str, str]:
    from trainmaster.models import JobSpec

    return JobSpec.model_validate_json(context.spec_json).env if context.spec_json else {}


def prepare(script: bool) -> None:
    """TF_CONFIG is in the environment already; the code builds its own strategy, as in Ray's docs."""
    _keras_as_installed()


def run_script(path: Path, args: list[str]) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    entrypoints.run_program(entrypoints.python_command(path, args), {}, rank=rank, what=path.name)
