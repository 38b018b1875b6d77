"""Ray Train's torch process-group set-up, with a control side that never imports torch.

Ray's `TorchConfig` lives in `ray.train.torch.config`, which imports torch at its top. Every process
that unpickles it pays that import (1 to 2 s of CPU here): the job's driver and the Ray Train
controller, neither of which runs a line of torch. `LeanTorchConfig` does the same set-up with Ray's
own worker-side functions, but only the workers import them, and they import torch anyway to train.

`lean_torch_trainer` builds the `DataParallelTrainer` that `TorchTrainer` would (TorchTrainer adds only
the backend default, which the driver always sets, and a local mode for zero workers, never used).
tests/unit/test_lean_torch.py pins the Ray functions used here, so a Ray upgrade that moves them
fails there, not in a job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig


@dataclass
class LeanTorchConfig(BackendConfig):
    """The fields and meaning of `ray.train.torch.TorchConfig`."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[LeanTorchBackend]:
        return LeanTorchBackend

    @property
    def train_func_context(self) -> type[CudaDeviceContext]:
        return CudaDeviceContext

    @property
    def framework(self) -> Any:
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}


class CudaDeviceContext:
    """Around the training function in each worker: the default CUDA device, as Ray's context sets it."""

    def __enter__(self) -> None:
        from ray.train.torch.config import TorchConfigContextManager

        TorchConfigContextManager().__enter__()

    def __exit__(self, *exc: object) -> None:
        return None


class LeanTorchBackend(Backend):
    """`ray.train.torch.config._TorchBackend.on_start`/`on_shutdown` for Ray Train v2 worker groups."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, LeanTorchConfig)
        from ray.train._internal.utils import get_address_and_port

        backend = backend_config.backend or _default_backend(worker_group.get_resources_per_worker())
        master_addr, master_port = worker_group.execute_single(0, get_address_and_port)
        if backend_config.init_method == "env":
            worker_group.execute(set_master_env, addr=master_addr, port=master_port)
            url = "env://"
        elif backend_config.init_method == "tcp":
            url = f"tcp://{master_addr}:{master_port}"
        else:
            raise ValueError(f"init_method must be 'env' or 'tcp', not {backend_config.init_method!r}")
        worker_group.execute(set_distributed_env)
        import ray

        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    setup_process_group,
                    backend=backend,
                    world_rank=rank,
                    world_size=len(worker_group),
                    init_method=url,
                    timeout_s=backend_config.timeout_s,
                )
                for rank in range(len(worker_group))
            ]
        )

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        futures = worker_group.execute_async(shutdown_process_group, destroy=len(worker_group) > 1)
        timeout_s = int(
            os.environ.get(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        )
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            print(f"[trainmaster] torch process group shutdown timed out after {timeout_s} s", flush=True)


def _default_backend(resources_per_worker: dict[str, float]) -> str:
    return "nccl" if resources_per_worker.get("GPU", 0) > 0 else "gloo"


# What the workers run, by reference: module-level, so unpickling them imports only this module.


def set_master_env(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


def set_distributed_env() -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def setup_process_group(**kwargs: Any) -> None:
    import torch.distributed as dist
    from ray.train.torch.config import _setup_torch_process_group

    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed; install a build with it")
    _setup_torch_process_group(**kwargs)


def shutdown_process_group(destroy: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy)


def lean_torch_trainer(*, torch_config: LeanTorchConfig, **trainer_kwargs: Any) -> Any:
    """`TorchTrainer(torch_config=..., **trainer_kwargs)`, torch-free in the driver and the controller."""
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return DataParallelTrainer(backend_config=torch_config, **trainer_kwargs)
