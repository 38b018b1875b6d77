"""Preemption through the real API, dispatcher and Ray: a high-priority gang needing the whole cluster
makes a low-priority job checkpoint and step aside, runs, and the low job resumes where it stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack, wait_until
from tests.e2e.test_ray_jobs import TERMINAL, wait_for

pytestmark = pytest.mark.ray

EPOCHS, SAMPLES, BATCH, WORKERS = 3, 2048, 64, 4
STEPS = EPOCHS * (SAMPLES // WORKERS // BATCH)  # what an unpreempted run trains


@pytest.fixture
def preempting(stack: Stack) -> Iterator[Stack]:
    """The session stack with its dispatcher replaced by one that preempts (the setting is off by default)."""
    stack.dispatchers.stop_all()
    stack.dispatchers.start("preempting", {"TRAINMASTER_PREEMPTION": "true", "TRAINMASTER_PREEMPTION_GRACE_S": "90"})
    try:
        yield stack
    finally:
        stack.dispatchers.stop_all()
        stack.dispatchers.start("d1")


def test_high_priority_gang_preempts_and_the_low_job_resumes_without_losing_a_step(preempting: Stack) -> None:
    whole = tm.Scaling(num_workers=WORKERS, resources_per_worker={"CPU": 1})
    assert preempting.ray.total_cpus() == WORKERS
    with preempting.client() as client:
        low = client.submit(
            name="low",
            entrypoint="builtin:mlp",
            scaling=whole,
            priority=0,
            config={"epochs": EPOCHS, "samples": SAMPLES, "batch_size": BATCH, "epoch_sleep_s": 2},
        )
        wait_for(client, low.id, {"running"}, timeout=300)
        wait_until(lambda: client.metrics(low.id, names=["loss"]), 120, interval=0.5, what="the low job to train")
        high = client.submit(
            name="high",
            entrypoint="builtin:mlp",
            scaling=whole,
            priority=10,
            config={"epochs": 1, "samples": 256, "batch_size": 64},
        )
        wait_for(client, low.id, {"queued"}, timeout=180)
        requeued = [e for e in client.events(low.id) if e.status is tm.JobStatus.queued][-1]
        assert f"preempted by {high.id}" in (requeued.message or ""), requeued.message

        done_high = wait_for(client, high.id, TERMINAL, timeout=300)
        assert done_high.status is tm.JobStatus.succeeded, done_high.error
        done_low = wait_for(client, low.id, TERMINAL, timeout=400)
        assert done_low.status is tm.JobStatus.succeeded, done_low.error
        assert [(a.n, a.status.value) for a in done_low.attempts] == [(1, "stopped"), (2, "succeeded")]
        assert done_low.attempts[0].error == f"preempted by {high.id}"

        kinds = [e.kind for e in client.events(low.id)]
        assert "preempt_requested" in kinds and "resumed" in kinds
        steps = [p.step for p in client.metrics(low.id, names=["loss"]) if p.rank == 0]
        assert sorted(steps) == list(range(1, STEPS + 1)), steps  # every step once: none lost, none redone
