"""A 1-worker NCCL job on a real GPU. Skipped where CUDA is absent (CI and the development machines)."""

from __future__ import annotations

import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack
from tests.factories.jobs import TERMINAL, small_mlp, wait_for_status

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.ray, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_one_worker_nccl_job_on_a_gpu(stack: Stack) -> None:
    with stack.client() as client:
        job = client.submit(
            name="nccl-1",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=1, use_gpu=True),
            config=small_mlp(),
            env={"NCCL_DEBUG": "INFO"},
        )
        done = wait_for_status(client, job.id, TERMINAL, timeout=300)
        assert done.status is tm.JobStatus.succeeded, done.error
        [runtime] = [e for e in client.events(job.id) if e.kind == "runtime"]
        print("runtime event:", runtime.data)
        assert runtime.data["backend"] == "nccl"
        assert runtime.data["device"].startswith("cuda")
        assert runtime.data["world_size"] == 1
