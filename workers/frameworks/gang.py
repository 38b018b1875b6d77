"""A Ray Train backend that tells every worker where the whole gang is: one (node IP, free port) per
world rank, found once the workers hold their placement-group bundles. The launchers that are not a
Ray trainer of their own (mpirun's hostfile, PaddlePaddle's endpoints, the JAX coordinator) read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig

Endpoint = tuple[str, int]

_gang: list[Endpoint] = []  # in each worker process: every rank's endpoint, rank order


def endpoints() -> list[Endpoint]:
    if not _gang:
        raise RuntimeError("the gang's endpoints are unknown: this worker was not started by GangConfig")
    return list(_gang)


def address_and_port() -> Endpoint:
    import ray.util

    from trainmaster.ports import free_port

    return ray.util.get_node_ip_address(), free_port(host="")


def remember(gang: list[Endpoint]) -> None:
    _gang[:] = gang


class _GangBackend(Backend):
    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        gang = [tuple(endpoint) for endpoint in worker_group.execute(address_and_port)]
        worker_group.execute(remember, gang)


@dataclass
class GangConfig(BackendConfig):
    @property
    def backend_cls(self) -> type[Backend]:
        return _GangBackend


def trainer(*, train_fn: Any, config: dict[str, Any], scaling: Any, run: Any) -> Any:
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return DataParallelTrainer(
        train_loop_per_worker=train_fn,
        train_loop_config=config,
        backend_config=GangConfig(),
        scaling_config=scaling,
        run_config=run,
    )


def world() -> tuple[int, int, int, int]:
    """(world rank, world size, local rank, local world size) of this worker, from Ray Train."""
    import ray.train

    context = ray.train.get_context()
    return (
        context.get_world_rank(),
        context.get_world_size(),
        context.get_local_rank(),
        context.get_local_world_size(),
    )
