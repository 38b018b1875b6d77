"""Gang admission: does a whole job (every worker plus the driver) fit the cluster?

Placement is simulated node by node the way a Ray placement group would place its bundles, so a
job whose total fits but whose bundles do not (4 x 1 GPU on two 2-GPU nodes under STRICT_PACK) is
told so. The answer carries a reason a person can act on.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainmaster.models import JobSpec, PlacementStrategy

Resources = dict[str, float]
EPSILON = 1e-9


class Decision(str, enum.Enum):
    admit = "admit"
    wait = "wait"
    infeasible = "infeasible"


@dataclass
class Node:
    node_id: str
    total: Resources
    free: Resources
    ip: str = ""

    @property
    def label(self) -> str:
        """`<ip>/<first 8 of the id>`: several raylets may share one machine's address."""
        return f"{self.ip}/{self.node_id[:8]}" if self.ip else self.node_id[:8]


@dataclass
class Cluster:
    nodes: list[Node] = field(default_factory=list)

    def total(self) -> Resources:
        return _sum(node.total for node in self.nodes)

    def free(self) -> Resources:
        return _sum(node.free for node in self.nodes)

    def reserve(self, placement: Mapping[str, list[Resources]]) -> None:
        """Take a placement's bundles out of the free resources (for later jobs in the same round)."""
        for node in self.nodes:
            for bundle in placement.get(node.node_id, []):
                for name, amount in bundle.items():
                    node.free[name] = node.free.get(name, 0.0) - amount


@dataclass
class Admission:
    decision: Decision
    reason: str
    placement: dict[str, list[Resources]] = field(default_factory=dict)


def gang(spec: JobSpec, driver: Resources) -> list[Resources]:
    """The bundles a job needs: one per worker, plus the driver's (when it asks for anything)."""
    bundles = [dict(spec.scaling.worker_resources()) for _ in range(spec.scaling.num_workers)]
    if any(amount > 0 for amount in driver.values()):
        bundles.append(dict(driver))
    return bundles


def admit(spec: JobSpec, cluster: Cluster, driver: Resources) -> Admission:
    bundles = gang(spec, driver)
    strategy = spec.scaling.placement_strategy
    need = describe(spec)
    if _place(bundles, [node.total for node in cluster.nodes], strategy, spec.scaling.num_workers) is None:
        total = _fmt(cluster.total())
        return Admission(
            Decision.infeasible,
            f"can never fit this cluster as it is: needs {need}; the cluster has {total} in all"
            f" on {len(cluster.nodes)} node(s): {nodes_free(cluster, free=False)}."
            " Add nodes with the resources, or ask for fewer.",
        )
    placement = _place(bundles, [node.free for node in cluster.nodes], strategy, spec.scaling.num_workers)
    if placement is None:
        fragmented = _fits(_sum(bundles), cluster.free())
        why = (
            "free resources add up, but no placement of the bundles fits the nodes" if fragmented else "not enough free"
        )
        return Admission(
            Decision.wait,
            f"waiting for resources: needs {need}; {why}; the cluster has {_fmt(cluster.free())} free"
            f" of {_fmt(cluster.total())}; nodes free: {nodes_free(cluster)}",
        )
    by_node = {cluster.nodes[index].node_id: node_bundles for index, node_bundles in placement.items()}
    return Admission(Decision.admit, f"fits: {need}", by_node)


def nodes_free(cluster: Cluster, limit: int = 8, *, free: bool = True) -> str:
    """Each node's free (or total) resources, the most first, for reasons a person reads."""

    def amounts(node: Node) -> Resources:
        return node.free if free else node.total

    ranked = sorted(cluster.nodes, key=lambda n: (-amounts(n).get("GPU", 0.0), -amounts(n).get("CPU", 0.0)))
    shown = [f"{node.label} {_fmt(amounts(node))}" for node in ranked[:limit]]
    more = f" and {len(ranked) - limit} more" if len(ranked) > limit else ""
    return ", ".join(shown) + more if shown else "no nodes"


def describe(spec: JobSpec) -> str:
    per_worker = spec.scaling.worker_resources()
    n = spec.scaling.num_workers
    parts = [f"{_num(amount * n)} {name}" for name, amount in per_worker.items() if name != "memory"]
    return f"{', '.join(parts)} as {n} x {_fmt(per_worker)} {spec.scaling.placement_strategy.value}"


def _place(
    bundles: list[Resources], capacities: list[Resources], strategy: PlacementStrategy, n_workers: int
) -> dict[int, list[Resources]] | None:
    """First-fit-decreasing placement; None when the bundles cannot be placed."""
    if not capacities:
        return None
    left = [dict(capacity) for capacity in capacities]
    order = sorted(range(len(left)), key=lambda i: -left[i].get("GPU", 0.0) - left[i].get("CPU", 0.0) / 1e3)
    if strategy is PlacementStrategy.STRICT_PACK:
        for index in order:
            if _fits_all(bundles, left[index]):
                return {index: list(bundles)}
        return None
    placement: dict[int, list[Resources]] = {}
    for position, bundle in enumerate(sorted(bundles, key=lambda b: -b.get("GPU", 0.0) - b.get("CPU", 0.0) / 1e3)):
        candidates = order
        if strategy is PlacementStrategy.STRICT_SPREAD and position < n_workers:
            candidates = [i for i in order if i not in placement]
        elif strategy is PlacementStrategy.SPREAD:
            candidates = sorted(order, key=lambda i: len(placement.get(i, [])))
        for index in candidates:
            if _fits(bundle, left[index]):
                _take(bundle, left[index])
                placement.setdefault(index, []).append(bundle)
                break
        else:
            return None
    return placement


def _fits(bundle: Resources, capacity: Resources) -> bool:
    return all(capacity.get(name, 0.0) + EPSILON >= amount for name, amount in bundle.items() if amount > 0)


def _fits_all(bundles: list[Resources], capacity: Resources) -> bool:
    return _fits(_sum(bundles), capacity)


def _take(bundle: Resources, capacity: Resources) -> None:
    for name, amount in bundle.items():
        capacity[name] = capacity.get(name, 0.0) - amount


def _sum(resources: object) -> Resources:
    total: Resources = {}
    for item in resources:  # type: ignore[attr-defined]
        for name, amount in item.items():
            total[name] = total.get(name, 0.0) + amount
    return total


def _num(value: float) -> str:
    return f"{value:g}"


RAY_INTERNAL = ("node:", "object_store_memory", "accelerator_type:")


def visible(resources: Mapping[str, float]) -> Resources:
    """The resources a person asks for and reads (CPU, GPU, memory, custom ones), without Ray's
    internal markers (`node:<ip>`, `accelerator_type:<name>`, the object store)."""
    return {name: amount for name, amount in resources.items() if not name.startswith(RAY_INTERNAL)}


def _fmt(resources: Mapping[str, float]) -> str:
    shown = visible(resources)
    if not shown:
        return "nothing"
    return "{" + ", ".join(f"{name}: {_amount(name, amount)}" for name, amount in sorted(shown.items())) + "}"


def _amount(name: str, amount: float) -> str:
    return f"{amount / 2**30:.3g} GiB" if name == "memory" else _num(amount)
