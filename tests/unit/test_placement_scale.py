"""What placement remembers within a round (api/dispatcher/placement.py) never outlives a change."""

from __future__ import annotations

import random

from api.dispatcher.placement import Cluster, Decision, Node, admit
from trainmaster.models import JobSpec


def cluster(free_gpus: list[float]) -> Cluster:
    return Cluster(
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
