"""PaddlePaddle: every worker runs the code with the collective environment that
`python -m paddle.distributed.launch` gives a process (PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM,
PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT, PADDLE_MASTER, …), so an unmodified
`paddle.distributed.init_parallel_env()` finds the gang; gloo on CPUs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainmaster.ports import free_port
from workers import entrypoints
from workers.frameworks import gang

PACKAGE = "paddle"
INSTALL = "pip install 'trainmaster[paddle]'"

_env: dict[str, str] = {}  # this worker's collective environment, once prepared


def trainer(spec: Any, *, train_fn: Any, config: dict[str, Any], scaling: Any, run: Any) -> Any:
    return gang.trainer(train_fn=train_fn, config=config, scaling=scaling, run=run)


def collective_env(
    endpoints: list[tuple[str, int]], rank: int, local_rank: int, local_size: int, master: str, use_gpu: bool
) -> dict[str, str]:
    """What paddle.distributed.launch's collective controller sets for one process."""
    listed = [f"{address}:{port}" for address, port in endpoints]
    env = {
        "PADDLE_MASTER": master,
        "PADDLE_GLOBAL_SIZE": str(len(listed)),
        "PADDLE_LOCAL_SIZE": str(local_size),
        "PADDLE_GLOBAL_RANK": str(rank),
        "PADDLE_LOCAL_RANK": str(local_rank),
        "PADDLE_NNODES": str(len({address for address, _ in endpoints})),
        "PADDLE_CURRENT_ENDPOINT": listed[rank],
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(len(listed)),
        "PADDLE_RANK_IN_NODE": str(local_rank),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(listed),
    }
    if not use_gpu:
        env["PADDLE_DISTRI_BACKEND"] = "gloo"  # a CPU gang: Paddle's process group over gloo
    return env


def prepare(script: bool) -> None:
    import ray
    import ray.train.collective
    import ray.util

    rank, _, local_rank, local_size = gang.world()
    master = ray.train.collective.broadcast_from_rank_zero(
        f"{ray.util.get_node_ip_address()}:{free_port(host='')}" if rank == 0 else None
    )
    use_gpu = bool(ray.get_gpu_ids())
    _env.clear()
    _env.update(collective_env(gang.endpoints(), rank, local_rank, local_size, master, use_gpu))
    if use_gpu:
        _env["FLAGS_selected_gpus"] = "0"  # Ray gives each worker its own GPU as device 0
    if not script:
        os.environ.update(_env)  # a function calls init_parallel_env() in this very process


def runtime() -> dict[str, Any]:
    return {"backend": _env.get("PADDLE_DISTRI_BACKEND", "nccl"), "world_size": int(_env["PADDLE_TRAINERS_NUM"])}


def run_script(path: Path, args: list[str]) -> None:
    entrypoints.run_program(
        entrypoints.python_command(path, args), dict(_env), rank=_env["PADDLE_TRAINER_ID"], what=path.name
    )
