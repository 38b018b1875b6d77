"""Horovod: the program runs under `mpirun` across the gang (see mpi.py), as `horovodrun` would
start it; Horovod's MPI controller finds its world there.

Ray Train v2 (the default in Ray 2.60) no longer supports `HorovodTrainer` (its constructor raises),
so the launcher is mpirun, not a Ray trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers import entrypoints
from workers.frameworks import mpi

PACKAGE = "horovod"
INSTALL = "HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1 pip install horovod (needs Open MPI and a compiler)"


def trainer(spec: Any, *, train_fn: Any, config: dict[str, Any], scaling: Any, run: Any) -> Any:
    return mpi.trainer(spec, train_fn=train_fn, config=config, scaling=scaling, run=run)


def prepare(script: bool) -> None:
    mpi.prepare(script)


def runtime() -> dict[str, Any]:
    return {**mpi.runtime(), "backend": "mpirun (Open MPI), Horovod's MPI controller"}


def run_script(path: Path, args: list[str]) -> None:
    mpi.launch(entrypoints.python_command(path, args), {}, path.name)
