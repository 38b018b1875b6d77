"""Turn a JobSpec's entrypoint into the function every Ray Train worker runs."""

from __future__ import annotations

import importlib
import os
import socket
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def torchrun_env(master_addr: str, master_port: int) -> dict[str, str]:
    """The environment torchrun gives a process, from this Ray Train worker's place in the gang."""
    import ray.train

    context = ray.train.get_context()
    return {
        "RANK": str(context.get_world_rank()),
        "LOCAL_RANK": str(context.get_local_rank()),
        "WORLD_SIZE": str(context.get_world_size()),
        "LOCAL_WORLD_SIZE": str(context.get_local_world_size()),
        "NODE_RANK": str(context.get_node_rank()),
        "GROUP_RANK": str(context.get_node_rank()),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def run_script(config: dict[str, Any]) -> None:
    """Run an unmodified torchrun-style script in this worker, as a child process.

    Ray Train already holds a process group in this process, so the script gets its own: rank 0
    picks a free port and shares it with the gang over Ray's group, then every worker starts the
    script with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
    """
    import ray.util
    import torch.distributed as dist

    script = Path(config["script"])
    workdir = Path(os.getcwd())  # the job's working directory, unpacked on this worker's node
    path = script if script.is_absolute() else workdir / script
    if not path.is_file():
        raise EntrypointError(f"script {script} not found in the job's working directory {workdir}")
    rendezvous: list[Any] = [None]
    if dist.get_rank() == 0:
        rendezvous = [(ray.util.get_node_ip_address(), free_port())]
    dist.broadcast_object_list(rendezvous, src=0)
    master_addr, master_port = rendezvous[0]
    env = {**os.environ, **torchrun_env(master_addr, master_port)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir), env.get("PYTHONPATH")]))
    command = [sys.executable, "-u", str(path), *config.get("args", [])]
    result = subprocess.run(command, env=env, cwd=workdir, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{script} exited with status {result.returncode} on rank {env['RANK']}")
