"""Room for waiting gangs decided over a snapshot (api/dispatcher/room.py): which active jobs shrink or
are preempted for which waiting job, as data, with no database. Through real dispatcher rounds on
PostgreSQL: tests/integration/test_preemption.py and test_quotas.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from api.dispatcher.decide import Verdict, decide
from api.dispatcher.placement import ClusterCapacity, Node
from api.dispatcher.quotas import Book, Standing
from api.dispatcher.reasons import Code
from api.dispatcher.room import Active, choose
from tests.factories.queue import queued_gang

NOW = datetime(2026, 1, 1, tzinfo=UTC)
A, B, C = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def full(gpus: int) -> ClusterCapacity:
    """A node of `gpus` GPUs, every one of them taken: a gang that fits it waits for resources."""
    return ClusterCapacity([Node("node0", {"CPU": 16.0, "GPU": float(gpus)}, {"CPU": 16.0, "GPU": 0.0})])


def running(
    project: uuid.UUID, gpus: int, *, priority: int = 0, started_min: int = 60, name: str = "b", **extra: Any
) -> Active:
    scaling = extra.pop("scaling", {"num_workers": gpus, "resources_per_worker": {"CPU": 1, "GPU": 1}})
    return Active(
        id=uuid.uuid4(),
        project_id=project,
        project=name,
        priority=priority,
        gang_cpus=float(gpus),
        gang_gpus=float(gpus),
        running=True,
        spec={"scaling": scaling},
        started_at=NOW - timedelta(minutes=started_min),
        last_checkpoint_at=extra.pop("checkpoint", None),
        **extra,
    )


def rooms_for(job: Any, active: list[Active], *, gpus: int = 8, book: Book | None = None, **settings: Any) -> Any:
    cluster, book = full(gpus), book or Book()
    decisions = decide([job], cluster, book, {}, now=NOW, preemption=True)
    [waiting] = decisions.of(Verdict.wait)
    options = {"preemption": True, "grace_s": 60.0, "guaranteed_shares": {}, "margin": 0.0} | settings
    return choose([waiting], active, cluster, book, NOW, **options)


def test_priority_preemption_takes_the_lowest_priority_then_the_newest_and_only_what_covers_the_gang() -> None:
    old_low, new_low, mid = running(B, 4, priority=-1), running(B, 4, priority=-1, started_min=5), running(B, 4)
    rooms = rooms_for(queued_gang(A, 4, priority=5), [mid, old_low, new_low])
    [room] = rooms.values()
    assert room.preempt == [new_low] and room.kind == "priority" and not room.shrink
    assert room.reason.code is Code.preempting and room.reason.params["count"] == 1
    assert new_low.preempted_by is not None  # the snapshot as the writes leave it: no later job takes it again


def test_a_guaranteed_share_keeps_its_jobs_and_an_equal_priority_is_never_taken() -> None:
    kept = running(B, 4, priority=-1, name="guarded")
    equal = running(C, 4, priority=5, name="c")
    rooms = rooms_for(queued_gang(A, 4, priority=5), [kept, equal], guaranteed_shares={"guarded": {"GPU": 4}})
    assert rooms == {}  # nothing may go: the job keeps waiting for resources


def test_elastic_gangs_shrink_before_anything_is_preempted_whole() -> None:
    elastic = {"num_workers": {"min": 2, "max": 8}, "resources_per_worker": {"CPU": 1, "GPU": 1}}
    wide = running(B, 8, priority=-1, scaling=elastic)
    [room] = rooms_for(queued_gang(A, 4, priority=5), [wide]).values()
    assert room.shrink == [(wide, 8, 4)] and room.preempt == []
    assert room.reason.code is Code.shrinking


def test_a_job_whose_victims_are_still_stopping_asks_nothing_more() -> None:
    job = queued_gang(A, 4, priority=5)
    asked = running(B, 4, priority=-1, preempted_by=job.id, preempt_requested_at=NOW)
    other = running(B, 4, priority=-1)
    [room] = rooms_for(job, [asked, other]).values()
    assert room.reason.code is Code.preempting_asked and room.preempt == [] and other.preempted_by is None


def test_reclaim_takes_borrowers_cheapest_first() -> None:
    quota = {"GPU": 4, "CPU": 4}
    book = Book({A: Standing("a", quota, "c"), B: Standing("b", quota, "c", usage={"GPU": 8, "CPU": 8})})
    fresh = running(B, 4, checkpoint=NOW - timedelta(minutes=1))
    stale = running(B, 4, checkpoint=NOW - timedelta(minutes=50))
    [room] = rooms_for(queued_gang(A, 4), [stale, fresh], book=book, preemption=False).values()
    assert room.kind == "reclaim" and room.preempt == [fresh]  # the least work since its checkpoint goes
    assert room.reason.code is Code.reclaiming and room.reason.params["cohort"] == "c"
