"""One module per `JobSpec.framework`: the Ray trainer (or launcher) that runs the gang, and what the
framework's own code sees inside each worker.

Every module defines the same names, so the driver never branches on the framework:

- `PACKAGE` (what the workers import) and `INSTALL` (the line that installs it);
- `trainer(spec, train_fn, config, scaling, run)`: the Ray Train trainer for the driver to `fit()`;
- `prepare(script)`: inside every worker, before the entrypoint (a script or a function) runs;
- `runtime()`: inside a worker, the backend and world size the framework itself will use;
- `run_script(path, args)`: inside a worker, run an unmodified script the way the framework's own
  launcher would (torchrun's, TF_CONFIG, jax.distributed's, mpirun, paddle.distributed.launch's env).

The gang, `trainmaster.log`, checkpoints (`ray.train.report`), cancel, timeout, retries and logs come
from the Ray job and Ray Train around it, so they behave the same for every framework.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

from trainmaster.models import Framework
from workers.entrypoints import EntrypointError


class FrameworkModule(Protocol):
    PACKAGE: str
    INSTALL: str

    def trainer(self, spec: Any, *, train_fn: Any, config: dict[str, Any], scaling: Any, run: Any) -> Any: ...

    def prepare(self, script: bool) -> None: ...

    def runtime(self) -> dict[str, Any]: ...

    def run_script(self, path: Path, args: list[str]) -> None: ...


class FrameworkMissing(EntrypointError):
    """The framework's package is not installed where the job runs; the message says how to add it."""


def module(framework: Framework | str) -> FrameworkModule:
    name = Framework(framework).value
    return cast(FrameworkModule, importlib.import_module(f"workers.frameworks.{name}"))


def require(framework: Framework | str) -> FrameworkModule:
    """The framework's module, once its package is importable here; otherwise fail at once, never hang."""
    found = module(framework)
    if importlib.util.find_spec(found.PACKAGE) is None:
        raise missing(Framework(framework).value, found)
    return found


def missing(name: str, found: FrameworkModule | ModuleType) -> FrameworkMissing:
    return FrameworkMissing(
        f"framework {name!r} needs the Python package {found.PACKAGE!r}, which is not installed on this "
        f"node; install it where the job runs ({found.INSTALL}) or add it to the job's `pip` list"
    )
