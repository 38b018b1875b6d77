"""Preemption through the real API, dispatcher and Ray: a high-priority gang needing the whole cluster
makes a low-priority job checkpoint and step aside, runs, and the low job resumes where it stopped; a
low-priority elastic gang is shrunk instead, in its attempt; and a project of a cohort takes back the
quota it lent the same way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack, wait_until
from tests.factories.auth import project_token, scoped_token
from tests.factories.jobs import TERMINAL, wait_for_status

pytestmark = pytest.mark.ray

EPOCHS, SAMPLES, BATCH, WORKERS = 3, 2048, 64, 4
STEPS = EPOCHS * (SAMPLES // WORKERS // BATCH)  # what an unpreempted run trains


@pytest.fixture
def preempting(stack: Stack) -> Iterator[Stack]:
    """The session stack with its dispatcher replaced by one that preempts (the setting is off by default)."""
    stack.dispatchers.stop_all()
    # An elastic gang's policy looks at its size every 3 s (Ray Train's default is 60).
    settings = {"TRAINMASTER_PREEMPTION": "true", "TRAINMASTER_PREEMPTION_GRACE_S": "90"}
    stack.dispatchers.start("preempting", {**settings, "TRAINMASTER_ELASTIC_RESIZE_INTERVAL_S": "3"})
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
        wait_for_status(client, low.id, {"running"}, timeout=300)
        wait_until(lambda: client.metrics(low.id, names=["loss"]), 120, interval=0.5, what="the low job to train")
        high = client.submit(
            name="high",
            entrypoint="builtin:mlp",
            scaling=whole,
            priority=10,
            config={"epochs": 1, "samples": 256, "batch_size": 64},
        )
        wait_for_status(client, low.id, {"queued"}, timeout=180)
        requeued = [e for e in client.events(low.id) if e.status is tm.JobStatus.queued][-1]
        assert f"preempted by {high.id}" in (requeued.message or ""), requeued.message

        done_high = wait_for_status(client, high.id, TERMINAL, timeout=300)
        assert done_high.status is tm.JobStatus.succeeded, done_high.error
        done_low = wait_for_status(client, low.id, TERMINAL, timeout=400)
        assert done_low.status is tm.JobStatus.succeeded, done_low.error
        assert [(a.n, a.status.value) for a in done_low.attempts] == [(1, "stopped"), (2, "succeeded")]
        assert done_low.attempts[0].error == f"preempted by {high.id}"

        kinds = [e.kind for e in client.events(low.id)]
        assert "preempt_requested" in kinds and "resumed" in kinds
        assert "checkpoint_reader" in kinds and "preempt_seen" in kinds  # stopped at the checkpoint it saved when asked
        steps = [p.step for p in client.metrics(low.id, names=["loss"]) if p.rank == 0]
        assert sorted(steps) == list(range(1, STEPS + 1)), steps  # every step once: none lost, none redone

        # Usage (issue 30): the preempted attempt's lost seconds are exactly those since its last
        # checkpoint (the one it saved when asked to), to its release; the rest of its run trained.
        preempted = done_low.attempts[0]
        saved = max(c.created_at for c in client.checkpoints(low.id) if c.attempt == 1)
        assert preempted.running_at and preempted.finished_at and preempted.lost_s is not None
        assert preempted.productive_s is not None
        since_saved = (preempted.finished_at - max(saved, preempted.running_at)).total_seconds()
        assert abs(preempted.lost_s - since_saved) < 1e-3, (preempted, saved)
        ran = (preempted.finished_at - preempted.running_at).total_seconds()
        assert abs(preempted.productive_s - (ran - since_saved)) < 1e-3 and preempted.productive_s > 0


def test_an_elastic_gang_is_shrunk_instead_of_preempted_and_keeps_its_attempt(preempting: Stack) -> None:
    """Issue 29 item 3: a low-priority `{min: 2, max: 4}` gang runs at 4 on the 4-CPU cluster; a
    high-priority 2-worker gang arrives. The dispatcher asks the elastic gang to shrink to 2 (no
    preemption), its own scaling policy (workers/elastic.py) reads that and Ray Train restarts the group
    at 2 from its checkpoint, the freed CPUs admit the high gang, and both succeed: the low job in the
    one attempt it started with."""
    elastic = tm.Scaling.model_validate({"num_workers": {"min": 2, "max": 4}, "resources_per_worker": {"CPU": 1}})
    with preempting.client() as client:
        low = client.submit(
            name="elastic-low",
            entrypoint="builtin:mlp",
            scaling=elastic,
            priority=0,
            config={"epochs": 4, "samples": 1024, "batch_size": 64, "epoch_sleep_s": 2},
        )
        started = wait_until(
            lambda: [e for e in client.events(low.id) if e.kind == "workers_started"], 300, interval=0.5, what="workers"
        )
        assert started[0].data["num_workers"] == 4  # the whole cluster was free: its max
        wait_until(lambda: client.metrics(low.id, names=["loss"]), 120, interval=0.5, what="the 4 workers to train")
        high = client.submit(
            name="high",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=2, resources_per_worker={"CPU": 1}),
            priority=10,
            config={"epochs": 1, "samples": 256, "batch_size": 64},
        )
        done_high = wait_for_status(client, high.id, TERMINAL, timeout=300)
        assert done_high.status is tm.JobStatus.succeeded, done_high.error
        trail = [(e.kind, e.message) for job in (high, low) for e in client.events(job.id)]
        assert any(e.kind == "shrinking" for e in client.events(high.id)), trail
        done_low = wait_for_status(client, low.id, TERMINAL, timeout=400)
        assert done_low.status is tm.JobStatus.succeeded, done_low.error
        low_trail = [(e.kind, e.message) for e in client.events(low.id)]
        assert [a.n for a in done_low.attempts] == [1], low_trail  # shrunk inside its attempt, never stopped
        events = client.events(low.id)
        kinds = [e.kind for e in events]
        assert "shrink_requested" in kinds and "preempt_requested" not in kinds, kinds
        # Started above the min it was admitted at (what it holds followed), then shrunk for the high gang.
        resizes = [(e.data["from"], e.data["to"], e.data["why"]) for e in events if e.kind == "resized"]
        assert [(a, b) for a, b, _ in resizes[:2]] == [(2, 4), (4, 2)], resizes
        assert "to make room for a higher-priority job" in resizes[1][2], resizes
        # The high gang's end lifts the cap: a low one still running then may grow back (once) to its max.
        assert all((a, b) == (2, 4) and "grows the gang" in why for a, b, why in resizes[2:]), resizes
        # Its metrics carry the worker count: rank 0 of each group said its size (a chart per size).
        sizes = [p.value for p in client.metrics(low.id, names=["sys/world_size"])]
        assert sizes[:1] == [4.0] and 2.0 in sizes, sizes


def test_a_project_reclaims_its_lent_quota_and_the_borrower_resumes_at_its_step(stack: Stack) -> None:
    """Two projects in one cohort, through the real stack and its usual dispatcher (the preemption setting
    off: reclaim is the quota's own): the borrower runs on the owner's idle quota; the owner submits
    within its quota; the borrower's job checkpoints, goes back to the queue and waits while the owner
    holds its quota, then resumes at its step."""
    database_url = stack.api.env["TRAINMASTER_DATABASE_URL"]
    with tm.Admin(stack.api.url, scoped_token(database_url, "default", "admin")) as admin:
        tokens = {name: project_token(database_url, name) for name in ("borrower", "owner")}
        admin.set_project("borrower", quota={"CPU": 1}, cohort="lab")
        admin.set_project("owner", quota={"CPU": WORKERS}, cohort="lab")
    whole = tm.Scaling(num_workers=WORKERS, resources_per_worker={"CPU": 1})
    with tm.Client(stack.api.url, tokens["borrower"]) as borrower, tm.Client(stack.api.url, tokens["owner"]) as owner:
        lent = borrower.submit(
            name="borrowed",
            entrypoint="builtin:mlp",
            scaling=whole,
            config={"epochs": EPOCHS, "samples": SAMPLES, "batch_size": BATCH, "epoch_sleep_s": 2},
        )
        wait_for_status(borrower, lent.id, {"running"}, timeout=300)
        wait_until(lambda: borrower.metrics(lent.id, names=["loss"]), 120, interval=0.5, what="the borrower to train")
        owed = owner.submit(name="owed", entrypoint="builtin:mlp", scaling=whole, config={"epochs": 1, "samples": 256})
        wait_for_status(borrower, lent.id, {"queued"}, timeout=180)
        asked = next(e for e in borrower.events(lent.id) if e.kind == "preempt_requested")
        assert "reclaims its quota" in (asked.message or "") and "cohort lab" in (asked.message or ""), asked.message
        waiting = borrower.get(lent.id)
        assert waiting.status is tm.JobStatus.queued  # while the owner holds its quota, nothing is left to lend

        assert wait_for_status(owner, owed.id, TERMINAL, timeout=300).status is tm.JobStatus.succeeded
        done = wait_for_status(borrower, lent.id, TERMINAL, timeout=400)
        assert done.status is tm.JobStatus.succeeded, done.error
        assert [(a.n, a.status.value) for a in done.attempts] == [(1, "stopped"), (2, "succeeded")]
        steps = [p.step for p in borrower.metrics(lent.id, names=["loss"]) if p.rank == 0 and p.step is not None]
        assert sorted(steps) == list(range(1, STEPS + 1)), steps  # resumed at its step: none lost, none redone
