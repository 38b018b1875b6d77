"""PyTorch: Ray Train's `TorchTrainer` (as its torch-free twin, workers/lean_torch.py); scripts get
torchrun's environment (also how Lightning's `strategy="ddp"`, Hugging Face Accelerate and DeepSpeed
scripts find their gang)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainmaster.ports import free_port
from workers import entrypoints
from workers.collectives.timeout import collective_timeout_s

PACKAGE = "torch"
INSTALL = "pip install 'trainmaster[workers]'"


def trainer(spec: Any, *, train_fn: Any, config: dict[str, Any], scaling: Any, run: Any) -> Any:
    """What `TorchTrainer` builds, with a control side that never imports torch (workers/lean_torch.py):
    the driver and the Ray Train controller each start 1 to 2 s sooner (bench/submit_latency.py, its `lean` path)."""
    from workers.lean_torch import LeanTorchConfig, lean_torch_trainer

    return lean_torch_trainer(
        train_loop_per_worker=train_fn,
        train_loop_config=config,
        scaling_config=scaling,
        torch_config=LeanTorchConfig(backend=spec.resolved_backend(), timeout_s=collective_timeout_s()),
        run_config=run,
    )


def runtime() -> dict[str, Any]:
    import torch.distributed as dist

    return {"backend": dist.get_backend(), "world_size": dist.get_world_size()}


def prepare(script: bool) -> None:
    """TorchTrainer already joined this worker to the process group."""


def torchrun_env(master_addr: str, master_port: int) -> dict[str, str]:
    """The environment torchrun gives a process, from this Ray Train worker's place in the gang."""
    import ray.train

    from trainmaster.context import JobContext

    job = JobContext.from_env()
    context = ray.train.get_context()
    return {
        # torchrun's rendezvous id; Lightning and Accelerate read it to know torchrun started them
        "TORCHELASTIC_RUN_ID": f"{job.job_id}-{job.attempt}" if job else "trainmaster",
        "RANK": str(context.get_world_rank()),
        "LOCAL_RANK": str(context.get_local_rank()),
        "WORLD_SIZE": str(context.get_world_size()),
        "LOCAL_WORLD_SIZE": str(context.get_local_world_size()),
        "NODE_RANK": str(context.get_node_rank()),
        "GROUP_RANK": str(context.get_node_rank()),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def run_script(path: Path, args: list[str]) -> None:
    """Run an unmodified torchrun-style script in this worker, as a child process.

    Ray Train already holds a process group in this process, so the script gets its own: rank 0
    picks a free port and shares it with the gang over Ray's group, then every worker starts the
    script with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
    """
    import ray.util
    import torch.distributed as dist

    rendezvous: list[Any] = [None]
    if dist.get_rank() == 0:
        rendezvous = [(ray.util.get_node_ip_address(), free_port(host=""))]
    dist.broadcast_object_list(rendezvous, src=0)
    master_addr, master_port = rendezvous[0]
    env = torchrun_env(master_addr, master_port)
    entrypoints.run_program(entrypoints.python_command(path, args), env, rank=env["RANK"], what=str(path.name))
