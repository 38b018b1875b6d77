"""What placement remembers within a round (api/dispatcher/placement.py) never outlives a change."""

from __future__ import annotations

import random

from api.dispatcher.placement import ClusterCapacity, Decision, Node, admit
from trainmaster.models import JobSpec


def cluster(free_gpus: list[float]) -> ClusterCapacity:
    return ClusterCapacity(
        [Node(f"n{i}", {"CPU": 16.0, "GPU": 8.0}, {"CPU": 16.0, "GPU": gpus}) for i, gpus in enumerate(free_gpus)]
    )


def job(gpus: float, workers: int = 1) -> JobSpec:
    scaling = {"num_workers": workers, "resources_per_worker": {"CPU": 1, "GPU": gpus}}
    return JobSpec.model_validate({"name": "j", "entrypoint": "builtin:mlp", "scaling": scaling})


def test_a_waiting_shape_is_told_the_free_resources_after_each_reserve() -> None:
    c = cluster([2.0, 3.0])
    first = admit(job(4), c, {})
    assert first.decision is Decision.wait and "GPU: 5" in first.reason
    small = admit(job(2), c, {})
    c.reserve(small.placement)
    again = admit(job(4), c, {})
    assert again.decision is Decision.wait and "GPU: 3" in again.reason and again.reason != first.reason
    again.reason = "changed by the caller"
    assert admit(job(4), c, {}).reason != "changed by the caller"  # each answer is its own


def test_the_kept_free_order_is_a_fresh_sort_after_reserves() -> None:
    rng = random.Random(3)
    c = cluster([rng.choice([0.0, 2.0, 4.0, 8.0]) for _ in range(40)])
    c.free_order()
    for _ in range(30):
        admission = admit(job(rng.choice([1.0, 2.0]), rng.choice([1, 2])), c, {})
        if admission.decision is Decision.admit:
            c.reserve(admission.placement)
    fresh = sorted(range(40), key=lambda i: (-c.nodes[i].free["GPU"] - c.nodes[i].free["CPU"] / 1e3, i))
    assert c.free_order() == fresh


def test_a_shape_without_room_stays_waiting_for_the_round_and_its_reason_follows_reserves() -> None:
    c = cluster([3.0, 3.0, 2.0])
    assert admit(job(4), c, {}).decision is Decision.wait
    one = admit(job(1), c, {})
    c.reserve(one.placement)
    later = admit(job(4), c, {})
    assert later.decision is Decision.wait and "GPU: 7" in later.reason  # 8 free before, 7 now
    listed = later.reason.split("nodes free: ")[1]
    assert listed == "n1 {CPU: 16, GPU: 3}, n2 {CPU: 16, GPU: 2}, n0 {CPU: 15, GPU: 2}"  # the free order


def test_the_scan_that_stops_early_places_like_a_full_scan() -> None:
    """Placement stops at the first node (in free order) with too little room for a bundle; the gangs it
    places and refuses are those a scan over every node places and refuses."""
    rng = random.Random(11)
    for _ in range(200):
        free = [rng.choice([0.0, 1.0, 2.0, 4.0, 8.0]) for _ in range(rng.randint(1, 30))]
        wanted = job(rng.choice([1.0, 2.0, 4.0]), rng.choice([1, 2, 3, 5]))
        fast = admit(wanted, cluster(free), {})
        fits_somewhere = sum(int(gpus // wanted.scaling.worker_resources()["GPU"]) for gpus in free)
        assert (fast.decision is Decision.admit) == (fits_somewhere >= wanted.scaling.num_workers), (free, wanted)
        if fast.decision is Decision.admit:
            assert sum(len(b) for b in fast.placement.values()) == wanted.scaling.num_workers
