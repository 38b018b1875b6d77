"""The torch-free control side of the torch backend (workers/lean_torch.py).

The driver and the Ray Train controller must not import torch (it costs each job 1 to 2 s of CPU on
its start-up path), and the Ray functions the workers call must still be the ones Ray's own
`TorchConfig` uses: a Ray upgrade that moves or reshapes them fails here, not in a job.

Nothing here imports Ray at module level: `import ray` fixes the process's Ray auth mode from the
environment of that moment, and collection runs before the session's Ray head sets RAY_AUTH_MODE.
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import textwrap


def test_the_config_has_the_fields_and_defaults_of_rays_torch_config() -> None:
    from ray.train.torch.config import TorchConfig

    from workers.lean_torch import LeanTorchBackend, LeanTorchConfig

    ours = {f.name: f.default for f in dataclasses.fields(LeanTorchConfig)}
    rays = {f.name: f.default for f in dataclasses.fields(TorchConfig)}
    assert ours == rays
    assert LeanTorchConfig().framework == TorchConfig().framework
    assert LeanTorchConfig(backend="gloo", timeout_s=5).to_dict() == TorchConfig(backend="gloo", timeout_s=5).to_dict()
    assert LeanTorchBackend.share_cuda_visible_devices is True


def test_the_ray_functions_the_workers_call_keep_their_signatures() -> None:
    from ray.train.torch import config

    assert list(inspect.signature(config._setup_torch_process_group).parameters) == [
        "backend",
        "world_rank",
        "world_size",
        "init_method",
        "timeout_s",
    ]
    assert list(inspect.signature(config._shutdown_torch).parameters) == ["destroy_process_group"]
    assert list(inspect.signature(config._set_torch_distributed_env_vars).parameters) == []
    assert hasattr(config.TorchConfigContextManager, "__enter__")


def test_building_and_shipping_a_torch_job_never_imports_torch(tmp_path: object) -> None:
    """What the driver builds and what the controller unpickles, in a fresh interpreter."""
    script = textwrap.dedent(
        f"""
        import sys
        import cloudpickle
        from ray.train import RunConfig, ScalingConfig
        from workers.driver import train_worker
        from workers.lean_torch import LeanTorchConfig, lean_torch_trainer

        trainer = lean_torch_trainer(
            train_loop_per_worker=train_worker,
            train_loop_config={{}},
            torch_config=LeanTorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="lean", storage_path={str(tmp_path)!r}),
        )
        shipped = cloudpickle.dumps((trainer.train_run_context, trainer._get_train_func()))
        cloudpickle.loads(shipped)[0].backend_config.backend_cls()
        print("torch" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
