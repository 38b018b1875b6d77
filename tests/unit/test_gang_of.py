"""A driver's gang as its newest placement group stands (api/dispatcher/ray_jobs.py, `gang_of`); the same
read through a real Ray head is tests/e2e/test_gang_state.py."""

from __future__ import annotations

from typing import Any

from api.dispatcher.ray_jobs import gang_of


def group(state: str, created_ns: int | None, scheduling: str | None = None) -> dict[str, Any]:
    stats: dict[str, Any] = {"scheduling_state": scheduling} if scheduling else {}
    if created_ns is not None:
        stats["creation_request_received_ns"] = str(created_ns)  # int64 as protobuf's JSON writes it
    return {"state": state, "stats": stats}


def test_the_newest_group_decides_and_an_older_placed_one_is_named() -> None:
    state = gang_of([group("CREATED", 100), group("PENDING", 200, "NO_RESOURCES"), group("REMOVED", 300)])
    assert not state.placed
    assert state.pending == "Ray: NO_RESOURCES; 1 earlier placement group(s) of this job still hold their bundles"


def test_a_newest_group_placed_is_placed_whatever_was_removed_before() -> None:
    assert gang_of([group("REMOVED", 100), group("CREATED", 200)]).placed
    assert gang_of([group("PENDING", 100, "INFEASIBLE"), group("CREATED", 200)]).placed


def test_a_group_moving_off_a_dead_node_is_not_placed() -> None:
    state = gang_of([group("RESCHEDULING", 100)])
    assert not state.placed and state.pending == "Ray: rescheduling"


def test_without_creation_times_a_placed_group_counts_and_nothing_live_is_nothing() -> None:
    assert gang_of([group("PENDING", None, "QUEUED"), group("CREATED", None)]).placed
    empty = gang_of([group("REMOVED", 1)])
    assert not empty.placed and empty.pending is None


def test_a_placed_group_shows_its_workers_one_bundle_each() -> None:
    """What an elastic gang is counted at, at least (api/jobs/gang_size.py), whatever the job reports."""
    bundle = {"unit_resources": {"CPU": 1.0}}
    newest = group("CREATED", 200) | {"bundles": [bundle] * 3}
    assert gang_of([group("REMOVED", 100) | {"bundles": [bundle] * 4}, newest]).workers == 3
    assert gang_of([group("CREATED", 100)]).workers is None  # Ray said nothing of its bundles
    assert gang_of([group("PENDING", 100, "QUEUED") | {"bundles": [bundle] * 2}]).workers is None
