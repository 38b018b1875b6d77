"""Elastic gangs (issue 29): `scaling.num_workers: {min, max}` is admitted when `min` fits and held at
`min` until it resizes; the driver hands Ray Train the (min, max) pair and lets the group restart
smaller after a lost worker; the controller's callback reports each resize as a `resized` event (from,
to, why), which the API turns into what the job holds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ray.train import ScalingConfig

from api.dispatcher.placement import ClusterCapacity, Decision, Node, admit
from trainmaster.models import JobSpec, Scaling
from workers import callbacks, driver


def elastic(low: int, high: int, **more: Any) -> JobSpec:
    body = {"name": "e", "entrypoint": "builtin:mlp", "scaling": {"num_workers": {"min": low, "max": high}}, **more}
    return JobSpec.model_validate(body)


def test_an_elastic_gang_is_admitted_when_its_minimum_fits() -> None:
    two_free = ClusterCapacity([Node("n1", {"CPU": 4}, {"CPU": 2})])
    admission = admit(elastic(2, 4), two_free, {})
    assert admission.decision is Decision.admit and sum(len(b) for b in admission.placement.values()) == 2
    assert "(elastic: 2 to 4 workers)" in admission.reason
    waiting = admit(elastic(3, 4), two_free, {})
    assert waiting.decision is Decision.wait and "needs 3 CPU" in waiting.reason
    assert admit(elastic(5, 8), two_free, {}).decision is Decision.infeasible  # not even its minimum, ever


def test_the_driver_gives_ray_train_the_range_and_restarts_for_lost_workers() -> None:
    spec = elastic(1, 3)
    scaling = ScalingConfig(**driver.ray_scaling(spec))  # Ray Train v2's own validation
    assert scaling.elasticity_enabled and (scaling.min_workers, scaling.max_workers) == (1, 3)
    assert driver.failures_allowed(spec) == driver.ELASTIC_RESTARTS
    assert driver.failures_allowed(elastic(1, 3, max_failures=7)) == 7
    fixed = JobSpec.model_validate({"name": "f", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 2}})
    assert ScalingConfig(**driver.ray_scaling(fixed)).num_workers == 2 and driver.failures_allowed(fixed) == 0
    assert Scaling.model_validate({"num_workers": {"min": 2, "max": 2}}).elastic  # a range, even of one size


def group(*nodes: str) -> Any:
    workers = [
        SimpleNamespace(
            metadata=SimpleNamespace(node_ip="10.0.0.1", node_id=node * 8, hostname="h", pid=1, gpu_ids=[]),
            distributed_context=SimpleNamespace(world_rank=rank, node_rank=rank),
        )
        for rank, node in enumerate(nodes)
    ]
    return SimpleNamespace(get_workers=lambda: workers)


def test_each_resize_of_the_group_is_an_event_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[str, str, dict[str, Any]]] = []
    monkeypatch.setattr(callbacks, "post_event", lambda kind, message, data=None: posted.append((kind, message, data)))
    placement = callbacks.PlacementCallback()
    placement.after_worker_group_start(group("a", "b", "c"))
    lost = SimpleNamespace(worker_failures={2: RuntimeError("node died")})
    placement.after_controller_state_update(None, type("RestartingState", (), {"training_failed_error": lost})())
    placement.after_worker_group_start(group("a", "b"))
    placement.after_controller_state_update(None, type("ResizingState", (), {})())
    placement.after_worker_group_start(group("a", "b", "d"))
    placement.after_worker_group_start(group("a", "b", "d"))  # the same size again: no resize
    resizes = [(message, data) for kind, message, data in posted if kind == "resized"]
    assert [data["from"] for _, data in resizes] == [3, 2] and [data["to"] for _, data in resizes] == [2, 3]
    assert resizes[0][0] == "3 -> 2 workers: worker rank(s) [2] lost on node(s) 10.0.0.1/cccccccc"
    assert "grows the gang toward its maximum" in resizes[1][1]["why"]


def test_a_first_group_larger_than_admitted_and_a_shrink_asked_for_are_resizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission accounts an elastic gang at its min; Ray Train may start it larger at once: what the job
    holds must follow (the API hears a resize from the min). A group the platform asked to shrink says so."""
    posted: list[tuple[str, str, dict[str, Any]]] = []
    monkeypatch.setattr(callbacks, "post_event", lambda kind, message, data=None: posted.append((kind, message, data)))
    spec = JobSpec.model_validate(
        {"name": "e", "entrypoint": "builtin:mlp", "scaling": {"num_workers": {"min": 2, "max": 4}}}
    )
    placement = callbacks.PlacementCallback(driver.admitted(spec))
    placement.after_worker_group_start(group("a", "b", "c", "d"))
    monkeypatch.setattr(callbacks, "max_workers", lambda: 2)  # the platform's cap (GET /v1/jobs/{id}/control)
    placement.after_controller_state_update(None, type("ResizingState", (), {})())
    placement.after_worker_group_start(group("a", "b"))
    # No cap: Ray Train's running-group check found a node gone (its raylet stopped answering) first.
    monkeypatch.setattr(callbacks, "max_workers", lambda: None)
    placement.after_controller_state_update(None, type("ResizingState", (), {})())
    placement.after_worker_group_start(group("a"))
    resizes = [data for kind, _, data in posted if kind == "resized"]
    assert [(r["from"], r["to"]) for r in resizes] == [(2, 4), (4, 2), (2, 1)]
    assert "room above the minimum" in resizes[0]["why"] and "asked it to shrink" in resizes[1]["why"]
    assert resizes[2]["why"] == f"{callbacks.NODE_LOST} on node(s) 10.0.0.1/bbbbbbbb"
    # ... and the loss is a `workers_lost` event as when the health check sees it first: rank 1 was there.
    [lost] = [data for kind, _, data in posted if kind == "workers_lost"]
    assert lost["ranks"] == [1] and lost["nodes"] == ["10.0.0.1/bbbbbbbb"] and lost["restarts"]
    fixed = JobSpec.model_validate({"name": "f", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 3}})
    assert driver.admitted(fixed) == 0  # a fixed gang's first group is no resize


def test_the_controller_lets_a_stopped_runs_resource_request_go_in_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped from outside never cancels its request to Ray's autoscaling coordinator, which then
    holds its resources from the next elastic gang: in the controller (where the callback is unpickled) a
    request lasts three renewals, not 180 s."""
    import pickle

    from ray.train.v2._internal.execution.scaling_policy import autoscaling_coordinator_client as coordinator

    monkeypatch.setattr(coordinator, "AUTOSCALING_REQUESTS_EXPIRE_TIME_S", 180)
    callbacks.PlacementCallback(2)  # made in the driver: nothing changes there
    assert coordinator.AUTOSCALING_REQUESTS_EXPIRE_TIME_S == 180
    copy = pickle.loads(pickle.dumps(callbacks.PlacementCallback(2)))
    assert copy.size == 2 and coordinator.AUTOSCALING_REQUESTS_EXPIRE_TIME_S == callbacks.REQUEST_EXPIRY_S
    assert callbacks.REQUEST_EXPIRY_S >= 3 * coordinator.AUTOSCALING_REQUESTS_INTERVAL_S  # a live run renews in time
