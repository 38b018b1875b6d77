from __future__ import annotations

from api.dispatcher.placement import ClusterCapacity, Decision, Node, admit
from trainmaster.models import JobSpec, Scaling


def cluster(*nodes: dict[str, float], used: list[dict[str, float]] | None = None) -> ClusterCapacity:
    made = []
    for i, total in enumerate(nodes):
        taken = (used or [{}] * len(nodes))[i]
        made.append(Node(f"n{i}", dict(total), {k: v - taken.get(k, 0.0) for k, v in total.items()}))
    return ClusterCapacity(made)


def spec(workers: int = 2, strategy: str = "PACK", **resources: float) -> JobSpec:
    return JobSpec(
        name="x",
        entrypoint="builtin:mlp",
        scaling=Scaling(num_workers=workers, placement_strategy=strategy, resources_per_worker=resources or None),
    )


def test_fits_on_free_cpus() -> None:
    result = admit(spec(2), cluster({"CPU": 4}), {})
    assert result.decision is Decision.admit
    assert sum(len(b) for b in result.placement.values()) == 2


def test_waits_when_busy_and_says_how_much_is_free() -> None:
    result = admit(spec(2), cluster({"CPU": 4}, used=[{"CPU": 3}]), {})
    assert result.decision is Decision.wait
    assert "needs 2 CPU" in result.reason and "CPU: 1" in result.reason and "CPU: 4" in result.reason


def test_gpus_on_a_cpu_cluster_are_infeasible() -> None:
    result = admit(spec(2, GPU=1), cluster({"CPU": 4}), {})
    assert result.decision is Decision.infeasible
    assert "can never fit" in result.reason and "2 GPU" in result.reason


def test_driver_counts_towards_the_gang() -> None:
    assert admit(spec(4), cluster({"CPU": 4}), {"CPU": 1}).decision is Decision.infeasible
    assert admit(spec(3), cluster({"CPU": 4}), {"CPU": 1}).decision is Decision.admit


def test_strict_pack_needs_one_node_that_holds_everything() -> None:
    two_nodes = cluster({"CPU": 8, "GPU": 2}, {"CPU": 8, "GPU": 2})
    assert admit(spec(4, "PACK", GPU=1), two_nodes, {}).decision is Decision.admit
    result = admit(spec(4, "STRICT_PACK", GPU=1), two_nodes, {})
    assert result.decision is Decision.infeasible


def test_strict_spread_needs_a_node_per_worker() -> None:
    two_nodes = cluster({"CPU": 8}, {"CPU": 8})
    assert admit(spec(2, "STRICT_SPREAD"), two_nodes, {}).decision is Decision.admit
    assert admit(spec(3, "STRICT_SPREAD"), two_nodes, {}).decision is Decision.infeasible


def test_fractional_gpus_share_a_device() -> None:
    assert admit(spec(2, GPU=0.5), cluster({"CPU": 4, "GPU": 1}), {}).decision is Decision.admit
    assert admit(spec(3, GPU=0.5), cluster({"CPU": 4, "GPU": 1}), {}).decision is Decision.infeasible


def test_reserve_takes_resources_for_the_rest_of_the_round() -> None:
    shared = cluster({"CPU": 4})
    first = admit(spec(3), shared, {})
    shared.reserve(first.placement)
    assert admit(spec(2), shared, {}).decision is Decision.wait


def test_custom_resources() -> None:
    assert admit(spec(1, TPU=1), cluster({"CPU": 4}), {}).decision is Decision.infeasible
    assert admit(spec(1, accel=2), cluster({"CPU": 4, "accel": 2}), {}).decision is Decision.admit
