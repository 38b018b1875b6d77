from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainmaster.models import TERMINAL_STATUSES, AttemptStatus, JobSpec, JobStatus, Scaling


def test_defaults_and_resources() -> None:
    spec = JobSpec(name="x", entrypoint="builtin:mlp")
    assert spec.scaling.num_workers == 1
    assert spec.scaling.worker_resources() == {"CPU": 1.0}
    assert spec.resolved_backend() == "gloo"


def test_gpu_resolves_nccl_and_fractional_gpu_counts() -> None:
    gpu = JobSpec(name="x", entrypoint="builtin:mlp", scaling=Scaling(use_gpu=True))
    assert gpu.scaling.worker_resources() == {"CPU": 1.0, "GPU": 1.0}
    assert gpu.resolved_backend() == "nccl"
    shared = JobSpec(
        name="x", entrypoint="builtin:mlp", scaling=Scaling(num_workers=2, resources_per_worker={"GPU": 0.5, "CPU": 2})
    )
    assert shared.uses_gpu and shared.scaling.worker_resources() == {"CPU": 2.0, "GPU": 0.5}
    assert (
        JobSpec(name="x", entrypoint="builtin:mlp", backend="gloo", scaling=Scaling(use_gpu=True)).resolved_backend()
        == "gloo"
    )


@pytest.mark.parametrize(
    "entrypoint",
    ["builtin:mlp", "builtin:tiny-gpt", "script:train.py", "script:src/train.py", "my_pkg.train:main", "train:fn"],
)
def test_valid_entrypoints(entrypoint: str) -> None:
    assert JobSpec(name="x", entrypoint=entrypoint).entrypoint == entrypoint


@pytest.mark.parametrize("entrypoint", ["", "train.py", "pkg.mod:", ":fn", "builtin:", "python train.py", "pkg-mod:fn"])
def test_invalid_entrypoints(entrypoint: str) -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec(name="x", entrypoint=entrypoint)
    assert "entrypoint" in str(caught.value)


def test_terminal_statuses_are_the_documented_four() -> None:
    # DESIGN.md: "Terminal: succeeded, failed, cancelled, timed_out."
    assert {s.value for s in JobStatus if s.terminal} == {"succeeded", "failed", "cancelled", "timed_out"}
    assert {s.value for s in TERMINAL_STATUSES} == {"succeeded", "failed", "cancelled", "timed_out"}
    assert not any(s.terminal for s in (JobStatus.queued, JobStatus.starting, JobStatus.running, JobStatus.cancelling))


def test_attempt_statuses_that_end_an_attempt() -> None:
    assert {s.value for s in AttemptStatus if s.terminal} == {"succeeded", "failed", "lost", "stopped", "timed_out"}
