"""Gang admission: does a whole job (every worker plus the driver) fit the cluster?

Placement is simulated node by node the way a Ray placement group would place its bundles, so a
job whose total fits but whose bundles do not (4 x 1 GPU on two 2-GPU nodes under STRICT_PACK) is
told so. The answer carries a reason a person can act on.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    """Nodes as one admission round sees them. While a round uses it, totals stay as they are and free
    resources change only through `reserve` (they only shrink), so `admit` remembers per gang shape
    whether it could ever fit, whether it found no room (then it finds none for the rest of the round)
    and, until the next `reserve`, why it waits: on a full cluster of a thousand nodes most of a
    round's queued jobs share a few shapes."""

    nodes: list[Node] = field(default_factory=list)
    _memo: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False, compare=False)
    _reserved: int = field(default=0, repr=False, compare=False)

    def total(self) -> Resources:
        return dict(self._kept("total", lambda: _sum(node.total for node in self.nodes)))

    def free(self) -> Resources:
        return dict(self._kept("free", lambda: _sum(node.free for node in self.nodes)))

    def reserve(self, placement: Mapping[str, list[Resources]]) -> None:
        """Take a placement's bundles out of the free resources (for later jobs in the same round)."""
        self._reserved += 1
        order = self._memo.get(("free order",))
        free = self._memo.get(("free",))
        where = self._kept("index", lambda: {node.node_id: index for index, node in enumerate(self.nodes)})
        for node_id, bundles in placement.items():
            index = where[node_id]
            node = self.nodes[index]
            if isinstance(order, list):
                order.pop(bisect.bisect_left(order, (_order_key(node.free), index)))
            for bundle in bundles:
                for name, amount in bundle.items():
                    node.free[name] = node.free.get(name, 0.0) - amount
                    if isinstance(free, dict):
                        free[name] = free.get(name, 0.0) - amount
            if isinstance(order, list):
                bisect.insort(order, (_order_key(node.free), index))

    def _kept(self, name: str, compute: Callable[[], Any]) -> Any:
        """A figure of the whole cluster computed once per round and kept (`reserve` updates the
        free resources and the free order it keeps)."""
        if (name,) not in self._memo:
            self._memo[(name,)] = compute()
        return self._memo[(name,)]

    def free_order(self) -> list[int]:
        """Node indices, the most free first (the order `_place` tries them in), kept up to date by
        `reserve` instead of sorted again for every job."""
        order = self._kept("free order", lambda: sorted((_order_key(n.free), i) for i, n in enumerate(self.nodes)))
        return [index for _, index in order]


def _order_key(capacity: Resources) -> float:
    return -capacity.get("GPU", 0.0) - capacity.get("CPU", 0.0) / 1e3


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
    shape = (need, spec.scaling.num_workers, *(tuple(sorted(bundle.items())) for bundle in bundles))
    feasible = cluster._memo.get(("feasible", *shape))
    if feasible is None:
        totals = [node.total for node in cluster.nodes]
        feasible = _place(bundles, totals, strategy, spec.scaling.num_workers) is not None
        cluster._memo[("feasible", *shape)] = feasible
    if not feasible:
        total = _fmt(cluster.total())
        return Admission(
            Decision.infeasible,
            f"can never fit this cluster as it is: needs {need}; the cluster has {total} in all"
            f" on {len(cluster.nodes)} node(s): {nodes_free(cluster, free=False)}."
            " Add nodes with the resources, or ask for fewer.",
        )
    waits = cluster._memo.get(("wait", cluster._reserved, *shape))
    if isinstance(waits, str):
        return Admission(Decision.wait, waits)
    placement = None
    if ("no room", *shape) not in cluster._memo:
        room = cluster._kept("free list", lambda: [node.free for node in cluster.nodes])  # changed in place
        placement = _place(bundles, room, strategy, spec.scaling.num_workers, cluster.free_order())
    if placement is None:
        # Free resources only shrink during a round, so a shape that found no room finds none later
        # in the round: only its reason (the free resources now) is written again after a reserve.
        cluster._memo[("no room", *shape)] = True
        free = cluster.free()
        fragmented = _fits(_sum(bundles), free)
        why = (
            "free resources add up, but no placement of the bundles fits the nodes" if fragmented else "not enough free"
        )
        reason = (
            f"waiting for resources: needs {need}; {why}; the cluster has {_fmt(free)} free"
            f" of {_fmt(cluster.total())}; nodes free: {nodes_free(cluster)}"
        )
        cluster._memo[("wait", cluster._reserved, *shape)] = reason
        return Admission(Decision.wait, reason)
    by_node = {cluster.nodes[index].node_id: node_bundles for index, node_bundles in placement.items()}
    return Admission(Decision.admit, f"fits: {need}", by_node)


def nodes_free(cluster: Cluster, limit: int = 8, *, free: bool = True) -> str:
    """Each node's free (or total) resources, the most first, for reasons a person reads. Free
    resources are ranked in the order placement tries the nodes (`Cluster.free_order`, kept by
    `reserve`), so a reason costs `limit` nodes, not a pass over all of them."""

    def amounts(node: Node) -> Resources:
        return node.free if free else node.total

    if free:
        ranked = [cluster.nodes[index] for index in cluster.free_order()[:limit]]
    else:
        # nsmallest is sorted(...)[:limit] (ties keep the nodes' order) without sorting every node.
        ranked = heapq.nsmallest(
            limit, cluster.nodes, key=lambda n: (-amounts(n).get("GPU", 0.0), -amounts(n).get("CPU", 0.0))
        )
    shown = [f"{node.label} {_fmt(amounts(node))}" for node in ranked]
    more = f" and {len(cluster.nodes) - limit} more" if len(cluster.nodes) > limit else ""
    return ", ".join(shown) + more if shown else "no nodes"


def describe(spec: JobSpec) -> str:
    per_worker = spec.scaling.worker_resources()
    n = spec.scaling.num_workers
    parts = [f"{_num(amount * n)} {name}" for name, amount in per_worker.items() if name != "memory"]
    return f"{', '.join(parts)} as {n} x {_fmt(per_worker)} {spec.scaling.placement_strategy.value}"


def _place(
    bundles: list[Resources],
    capacities: list[Resources],
    strategy: PlacementStrategy,
    n_workers: int,
    order: list[int] | None = None,
) -> dict[int, list[Resources]] | None:
    """First-fit-decreasing placement; None when the bundles cannot be placed.

    `order` is the capacities' indices sorted by `_order_key` (ties by index), when the caller keeps
    it (`Cluster.free_order`); otherwise it is sorted here. A node's capacity is copied only when a
    bundle is taken from it."""
    if not capacities:
        return None
    if order is None:
        order = sorted(range(len(capacities)), key=lambda i: _order_key(capacities[i]))
    left: dict[int, Resources] = {}
    if strategy is PlacementStrategy.STRICT_PACK:
        whole = _sum(bundles)
        for index in _with_room(order, capacities, whole):
            if _fits(whole, capacities[index]):
                return {index: list(bundles)}
        return None
    placement: dict[int, list[Resources]] = {}
    for position, bundle in enumerate(sorted(bundles, key=lambda b: -b.get("GPU", 0.0) - b.get("CPU", 0.0) / 1e3)):
        candidates: Iterable[int]
        if strategy is PlacementStrategy.STRICT_SPREAD and position < n_workers:
            candidates = _with_room((i for i in order if i not in placement), capacities, bundle)
        elif strategy is PlacementStrategy.SPREAD:
            # The nodes holding fewest of the gang's bundles first, each group in `order`: nodes
            # holding none are `order` less the placed ones; the placed ones are a few.
            rank = {index: at for at, index in enumerate(order) if index in placement} if placement else {}
            placed = sorted(placement, key=lambda i: (len(placement[i]), rank[i]))
            fresh = _with_room((i for i in order if i not in placement), capacities, bundle)
            candidates = itertools.chain(fresh, placed)
        else:
            candidates = _with_room(order, capacities, bundle)
        for index in candidates:
            if _fits(bundle, left.get(index, capacities[index])):
                if index not in left:
                    left[index] = dict(capacities[index])
                _take(bundle, left[index])
                placement.setdefault(index, []).append(bundle)
                break
        else:
            return None
    return placement


def _with_room(order: Iterable[int], capacities: list[Resources], bundle: Resources) -> Iterator[int]:
    """`order` (sorted by `_order_key`, the most room first) up to the first node whose key shows it
    has too little GPU and CPU together for `bundle`: no node after it can hold the bundle either. On
    a full cluster of a thousand nodes this ends the scan after the few nodes with room."""
    bound = _order_key(bundle) + 1e-6  # a node that fits has a key at most this
    for index in order:
        if _order_key(capacities[index]) > bound:
            return
        yield index


def _fits(bundle: Resources, capacity: Resources) -> bool:
    return all(capacity.get(name, 0.0) + EPSILON >= amount for name, amount in bundle.items() if amount > 0)


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
