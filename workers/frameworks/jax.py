"""JAX: Ray Train's `JaxTrainer`, whose workers join `jax.distributed` before the function runs.

In Ray 2.60 `JaxTrainer` runs on CPUs, but its backend starts `jax.distributed` only for TPUs or
GPUs (`_JaxBackend.on_start` returns early otherwise), so each CPU worker would see a world of one.
`CpuJaxConfig` runs Ray's own set-up function (`_setup_jax_distributed_environment`, which has a CPU
branch) with `JAX_PLATFORMS=cpu` on a CPU gang; JAX's gloo CPU collectives carry the all-reduce.

Scripts run under `mpirun` across the gang (see mpi.py): an unmodified `jax.distributed.initialize()`
detects Open MPI by itself, as JAX documents; the coordinator is a free port on rank 0's node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.train.v2.jax.config import (
    JaxConfig,
    _JaxBackend,
    _setup_jax_distributed_environment,
    _shutdown_jax_distributed,
)

from trainmaster.ports import free_port
from workers import entrypoints
from workers.frameworks import gang, mpi

PACKAGE = "jax"
INSTALL = "pip install 'trainmaster[jax]'"


def _join_on_cpu(coordinator: str, num_workers: int, index: int) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _setup_jax_distributed_environment(coordinator, num_workers, index, False, False, {})


class _CpuJaxBackend(_JaxBackend):
    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        if backend_config.use_gpu or backend_config.use_tpu:
            super().on_start(worker_group, backend_config)
            return
        endpoints = [tuple(e) for e in worker_group.execute(gang.address_and_port)]
        worker_group.execute(gang.remember, endpoints)
        if backend_config.script:
            return  # the script joins jax.distributed itself, under mpirun
        address, port = endpoints[0]
        coordinator = f"{address}:{port}"
        import ray

        size = len(endpoints)
        ray.get([worker_group.execute_single_async(i, _join_on_cpu, coordinator, size, i) for i in range(size)])

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        if backend_config.use_gpu or backend_config.use_tpu:
            super().on_shutdown(worker_group, backend_config)
        elif not backend_config.script:
            worker_group.execute(_shutdown_jax_distributed)


@dataclass
class CpuJaxConfig(JaxConfig):
    script: bool = False

    @property
    def backend_cls(self) -> type[_JaxBackend]:
        return _CpuJaxBackend


def trainer(spec: Any, *, train_fn: Any, config: dict[str, Any], scaling: Any, run: Any) -> Any:
    from ray.train.v2.jax import JaxTrainer

    return JaxTrainer(
        train_loop_per_worker=train_fn,
        train_loop_config=config,
        jax_config=CpuJaxConfig(use_gpu=spec.uses_gpu, script=spec.entrypoint.startswith("script:")),
        scaling_config=scaling,
        run_config=run,
    )


_script_mode = [False]


def prepare(script: bool) -> None:
    _script_mode[0] = script
    if script:
        mpi.prepare(script)


def runtime() -> dict[str, Any]:
    if _script_mode[0]:
        return {"backend": "mpirun, then jax.distributed (Open MPI detected)", "world_size": len(gang.endpoints())}
    import jax

    platform = os.environ.get("JAX_PLATFORMS", "")
    backend = "jax.distributed (gloo CPU collectives)" if platform == "cpu" else f"jax.distributed ({platform})"
    return {"backend": backend, "world_size": jax.process_count()}


def run_script(path: Path, args: list[str]) -> None:
    address, _ = gang.endpoints()[0]
    port = free_port(host="")  # every interface: the other nodes' processes connect to it
    coordinator = f"{address}:{port}"  # read on rank 0 only, where mpirun runs
    mpi.launch(entrypoints.python_command(path, args), {"JAX_COORDINATOR_ADDRESS": coordinator}, path.name)
