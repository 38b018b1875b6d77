"""Turn a JobSpec's entrypoint into the function every Ray Train worker runs."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

TrainFn = Callable[[dict[str, Any]], Any]

BUILTINS = {
    "mlp": "workers.templates.mlp:train_loop_per_worker",
    "tiny-gpt": "workers.templates.tiny_gpt:train_loop_per_worker",
    "collectives": "workers.collectives.job:train_loop_per_worker",
    "toy-curve": "workers.templates.toy_curve:train_loop_per_worker",
}


class EntrypointError(Exception):
    """The entrypoint cannot be loaded; the message says what to fix."""


def resolve(entrypoint: str) -> TrainFn:
    """The function for 'builtin:NAME' or 'pkg.module:function'. Script mode is `run_script`."""
    if entrypoint.startswith("builtin:"):
        name = entrypoint.removeprefix("builtin:")
        if name not in BUILTINS:
            raise EntrypointError(f"unknown built-in {name!r}; choose one of {', '.join(sorted(BUILTINS))}")
        return _load(BUILTINS[name])
    return _load(entrypoint)


def _load(target: str) -> TrainFn:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EntrypointError(
            f"cannot import {module_name!r} ({exc}); upload the code that holds it with the job "
            "(working_dir / POST /v1/code) or install it on the cluster"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise EntrypointError(f"{module_name!r} has no function {attr!r}")
    return fn


def script_path(script: str) -> Path:
    """The script inside the job's working directory (unpacked on this worker's node), checked."""
    workdir = Path(os.getcwd())
    path = Path(script) if Path(script).is_absolute() else workdir / script
    if not path.is_file():
        raise EntrypointError(f"script {script} not found in the job's working directory {workdir}")
    return path


def run_program(command: list[str], env: dict[str, str], *, rank: int | str, what: str) -> None:
    """Run a user's program as a child of this worker, in the job's working directory, with `env` on
    top of this worker's environment; its output goes to the job's logs like the worker's own."""
    workdir = Path(os.getcwd())
    full_env = {**os.environ, **env}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir), full_env.get("PYTHONPATH")]))
    result = subprocess.run(command, env=full_env, cwd=workdir, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{what} exited with status {result.returncode} on rank {rank}")


def python_command(path: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-u", str(path), *args]
