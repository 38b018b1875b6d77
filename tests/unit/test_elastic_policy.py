"""workers/elastic.py on Ray Train's own classes: an elastic gang's policy counts no more workers than
the platform's cap (a dispatcher shrinking it to make room), so Ray Train's running-group check
decides to resize it down; without a cap it is Ray's policy unchanged; the driver's hook is where
Ray Train builds policies."""

from __future__ import annotations

import inspect
import pickle
import socket
from types import SimpleNamespace
from typing import Any

import pytest
from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy, NoopDecision, ResizeDecision
from ray.train.v2.api import data_parallel_trainer
from ray.train.v2.api.config import ScalingConfig

from workers import elastic

NODES = {"n1": {"CPU": 4.0}, "n2": {"CPU": 4.0}}  # room for 8 one-CPU workers


def policy(monkeypatch: pytest.MonkeyPatch, cap: int | None, min_workers: int = 1) -> elastic.CappedElasticPolicy:
    monkeypatch.setattr(elastic, "max_workers", lambda: cap)
    made = elastic.scaling_policy(ScalingConfig(num_workers=(min_workers, 4), resources_per_worker={"CPU": 1}))
    assert isinstance(made, elastic.CappedElasticPolicy)
    # The autoscaling coordinator (an actor the controller starts): its answer, and no request sent.
    made._get_reserved_resources = lambda: NODES  # type: ignore[method-assign]
    made._maybe_send_resource_request = lambda: None  # type: ignore[method-assign]
    return made


def running(made: elastic.CappedElasticPolicy, workers: int) -> Any:
    group = SimpleNamespace(start_time=float("-inf"), num_workers=workers, workers=[])
    return made.make_decision_for_running_worker_group(group, SimpleNamespace())


def test_a_capped_gang_is_resized_down_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    decision = running(policy(monkeypatch, cap=2), workers=4)
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 2


def test_without_a_cap_it_is_ray_trains_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(running(policy(monkeypatch, cap=None), workers=4), NoopDecision)  # 4 fit: stays
    assert running(policy(monkeypatch, cap=None), workers=2).num_workers == 4  # grows to max


def test_the_cap_never_takes_it_below_its_min(monkeypatch: pytest.MonkeyPatch) -> None:
    assert running(policy(monkeypatch, cap=1, min_workers=3), workers=4).num_workers == 3


def test_a_node_whose_raylet_does_not_answer_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a lost node the coordinator still reserves it: a restart counts only what answers."""
    made = policy(monkeypatch, cap=None)
    made._get_reserved_resources = lambda: {"n1": {"CPU": 2.0}, "n2": {"CPU": 2.0}}  # type: ignore[method-assign]
    monkeypatch.setattr(elastic, "answering", lambda nodes: nodes)
    assert made.make_decision_for_non_running_worker_group().num_workers == 4  # type: ignore[attr-defined]
    monkeypatch.setattr(elastic, "answering", lambda nodes: nodes - {"n2"})
    assert made.make_decision_for_non_running_worker_group().num_workers == 2  # type: ignore[attr-defined]
    monkeypatch.setattr(elastic, "answering", lambda nodes: set())
    assert isinstance(made.make_decision_for_non_running_worker_group(), NoopDecision)  # below min: it waits


def group_on(*nodes: str, started: float) -> Any:
    workers = [SimpleNamespace(metadata=SimpleNamespace(node_id=node)) for node in nodes]
    return SimpleNamespace(start_time=started, num_workers=len(workers), workers=workers)


def test_a_running_group_with_a_worker_on_a_dead_node_is_resized_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's policy considers resizes once a minute (elastic_resize_monitor_interval_s); a lost node is not
    left to Ray's health check: at the next check the group restarts on what answers."""
    made = policy(monkeypatch, cap=None)
    made._get_reserved_resources = lambda: {"n1": {"CPU": 2.0}, "n2": {"CPU": 2.0}}  # type: ignore[method-assign]
    just_started = group_on("n1", "n1", "n2", "n2", started=elastic.time_monotonic())
    monkeypatch.setattr(elastic, "answering", lambda nodes: nodes)
    assert isinstance(made.make_decision_for_running_worker_group(just_started, SimpleNamespace()), NoopDecision)
    probed: list[str] = []

    def answering(nodes: set[str]) -> set[str]:
        probed.extend(nodes)
        return nodes - {"n2"}

    monkeypatch.setattr(elastic, "answering", answering)
    decision = made.make_decision_for_running_worker_group(just_started, SimpleNamespace())
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 2
    assert sorted(probed) == ["n1", "n2"]  # each node probed once in the check (a dead host costs 1 s)
    # What answers is below its min: no resize here (Ray Train's failure handling restarts it when it can).
    strict = policy(monkeypatch, cap=None, min_workers=3)
    strict._get_reserved_resources = made._get_reserved_resources  # type: ignore[method-assign]
    assert isinstance(strict.make_decision_for_running_worker_group(just_started, SimpleNamespace()), NoopDecision)


def test_raylet_addresses_are_asked_of_ray_once_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """A running group's nodes are probed every 2 s: Ray's node list is read only for nodes not seen."""
    asked: list[int] = []
    listing = [
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": 1},
        {"NodeID": "b", "Alive": False, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": 2},
    ]
    monkeypatch.setattr(elastic.ray, "is_initialized", lambda: True)

    def nodes() -> list[dict[str, Any]]:
        asked.append(1)
        return listing

    monkeypatch.setattr(elastic.ray, "nodes", nodes)
    monkeypatch.setattr(elastic, "accepts", lambda address: address == ("127.0.0.1", 1))
    monkeypatch.setattr(elastic, "_raylets", {})
    assert elastic.answering({"a"}) == {"a"} and elastic.answering({"a"}) == {"a"} and len(asked) == 1
    assert elastic.answering({"a", "b"}) == {"a"} and len(asked) == 2  # b: not seen alive, asked again


def test_the_probe_tells_a_listening_port_from_a_closed_one() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = server.getsockname()
        assert elastic.accepts(address)
    assert not elastic.accepts(address)  # closed: refused at once


def test_the_policy_travels_to_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    """It is built in the driver and sent to the controller actor, as Ray's own is."""
    made = elastic.scaling_policy(ScalingConfig(num_workers=(1, 4)))
    copy = pickle.loads(pickle.dumps(made))
    assert isinstance(copy, elastic.CappedElasticPolicy)
    assert copy._count_possible_workers(NODES) == 4  # outside a job no cap: Ray's count (its max)


def test_install_hooks_where_ray_train_builds_its_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Ray release that builds its policy elsewhere would leave elastic gangs uncapped: this fails then.
    assert "create_scaling_policy(self.scaling_config)" in inspect.getsource(data_parallel_trainer.DataParallelTrainer)
    monkeypatch.setattr(data_parallel_trainer, "create_scaling_policy", data_parallel_trainer.create_scaling_policy)
    elastic.install()
    assert data_parallel_trainer.create_scaling_policy is elastic.scaling_policy
    assert isinstance(elastic.scaling_policy(ScalingConfig(num_workers=2)), FixedScalingPolicy)
