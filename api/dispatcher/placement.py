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

from trainmaster.models import JobSpec, PlacementStrategy, Scaling

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
    labels: dict[str, str] = field(default_factory=dict)  # `ray start --labels rack=r1`

    @property
    def label(self) -> str:
        """`<ip>/<first 8 of the id>`: several raylets may share one machine's address."""
        return f"{self.ip}/{self.node_id[:8]}" if self.ip else self.node_id[:8]


@dataclass
class ClusterCapacity:
    """A Ray cluster's nodes with their total and free resources, as one admission round (or one
    `GET /v1/cluster`) read them; not the registered cluster (`ClusterRow`) nor its wire form
    (`trainmaster.models.Cluster`). While a round uses it, totals stay as they are and free
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
        labels: dict[str, dict[str, Resources]] = self._kept("domain free", dict)
        where = self._kept("index", lambda: {node.node_id: index for index, node in enumerate(self.nodes)})
        for node_id, bundles in placement.items():
            index = where[node_id]
            node = self.nodes[index]
            if isinstance(order, list):
                order.pop(bisect.bisect_left(order, (_order_key(node.free), index)))
            # The free resources admit_in_domain keeps of each label's domains: this node's.
            domain_frees = [sums[node.labels[label]] for label, sums in labels.items() if label in node.labels]
            for bundle in bundles:
                for name, amount in bundle.items():
                    node.free[name] = node.free.get(name, 0.0) - amount
                    if isinstance(free, dict):
                        free[name] = free.get(name, 0.0) - amount
                    for domain in domain_frees:
                        domain[name] = domain.get(name, 0.0) - amount
            if isinstance(order, list):
                bisect.insort(order, (_order_key(node.free), index))

    def _kept(self, name: str | tuple[object, ...], compute: Callable[[], Any]) -> Any:
        """A figure of the whole cluster computed once per round and kept (`reserve` updates the
        free resources, the free order and the label domains' free resources it keeps)."""
        key = name if isinstance(name, tuple) else (name,)
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def free_order(self) -> list[int]:
        """Node indices, the most free first (the order `_place` tries them in)."""
        return [index for _, index in self._free_keys()]

    def _free_keys(self) -> list[tuple[float, int]]:
        """(`_order_key` of the free resources, node index), sorted: kept up to date by `reserve`
        instead of sorted again for every job, and read in place (a job's scan stops after the few
        nodes with room, so no copy of a thousand entries is made for it)."""
        keys: list[tuple[float, int]] = self._kept("free order", lambda: _sorted_keys(n.free for n in self.nodes))
        return keys

    def _total_keys(self) -> list[tuple[float, int]]:
        """The same for the total resources (whether a gang could ever fit), sorted once per round."""
        keys: list[tuple[float, int]] = self._kept("total order", lambda: _sorted_keys(n.total for n in self.nodes))
        return keys


def _order_key(capacity: Resources) -> float:
    return -capacity.get("GPU", 0.0) - capacity.get("CPU", 0.0) / 1e3


def _sorted_keys(capacities: Iterable[Resources]) -> list[tuple[float, int]]:
    """(`_order_key`, index) of each capacity, sorted: the key is written out here (a thousand nodes a round)."""
    keys = [(-capacity.get("GPU", 0.0) - capacity.get("CPU", 0.0) / 1e3, i) for i, capacity in enumerate(capacities)]
    keys.sort()
    return keys


@dataclass
class Admission:
    decision: Decision
    reason: str
    placement: dict[str, list[Resources]] = field(default_factory=dict)
    # The node label value the gang was placed inside (`scaling.topology`), which its launch asks Ray
    # Train to keep its workers in (ScalingConfig.label_selector); None: anywhere.
    selector: dict[str, str] | None = None


def gang_bundles(spec: JobSpec | Scaling, driver: Resources) -> list[Resources]:
    """The bundles a job needs: one per worker, plus the driver's (when it asks for anything)."""
    scaling = _scaling(spec)
    bundles = [dict(scaling.worker_resources()) for _ in range(scaling.min_workers)]  # elastic: its minimum
    if any(amount > 0 for amount in driver.values()):
        bundles.append(dict(driver))
    return bundles


def admit(spec: JobSpec | Scaling, cluster: ClusterCapacity, driver: Resources) -> Admission:
    """Whether the gang of `spec` (a whole JobSpec, or only its `scaling`: all placement reads) fits."""
    scaling = _scaling(spec)
    if scaling.topology is not None:
        return admit_in_domain(scaling, cluster, driver)
    bundles = gang_bundles(scaling, driver)
    strategy = scaling.placement_strategy
    need = describe(scaling)
    # Every worker's bundle is the same: the shape is the description, the worker's and the driver's bundle.
    shape = (need, scaling.min_workers, tuple(sorted(bundles[0].items())), tuple(sorted(driver.items())))
    feasible = cluster._memo.get(("feasible", *shape))
    if feasible is None:
        totals = cluster._kept("total list", lambda: [node.total for node in cluster.nodes])
        feasible = _place(bundles, totals, strategy, scaling.min_workers, cluster._total_keys()) is not None
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
        placement = _place(bundles, room, strategy, scaling.min_workers, cluster._free_keys())
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


def admit_in_domain(scaling: Scaling, cluster: ClusterCapacity, driver: Resources) -> Admission:
    """A gang with a `topology`: its workers inside one value of a node label (the driver's bundle goes
    where Ray puts the driver, anywhere). The domains are tried the most free first; `required` waits
    (or can never fit) when none has room, naming the domains it considered; `preferred` is then placed
    across the cluster as any gang, as few nodes as first-fit takes.

    Per round, the cluster keeps (`ClusterCapacity._memo`) each label's domains with their total and free
    resources (`reserve` updates the free ones), whether a gang shape could ever fit one, and which
    found no room for it (free resources only shrink in a round): on 10,000 nodes in 100 racks a
    gang's placement then tries only the domains whose free resources add up to what it needs."""
    assert scaling.topology is not None
    label, required = scaling.topology.label, scaling.topology.required is not None
    workers = gang_bundles(scaling, {})
    need = describe(scaling)
    kept_frees: dict[str, dict[str, Resources]] = cluster._kept("domain free", dict)  # by label; `reserve` updates
    domains: dict[str, list[int]] = cluster._kept(f"domains {label}", lambda: _domains(cluster, label, kept_frees))
    frees = kept_frees[label]
    shape = (label, scaling.placement_strategy, len(workers), tuple(sorted(workers[0].items())) if workers else ())

    def fits(indices: list[int], free: bool) -> dict[int, list[Resources]] | None:
        capacities = [cluster.nodes[i].free if free else cluster.nodes[i].total for i in indices]
        placed = _place(workers, capacities, scaling.placement_strategy, scaling.min_workers)
        return None if placed is None else {indices[i]: bundles for i, bundles in placed.items()}

    def seen(free: bool) -> str:
        def amounts(value: str) -> Resources:
            return frees[value] if free else _sum(cluster.nodes[i].total for i in domains[value])

        shown = [f"{label}={value} {_fmt(amounts(value))}" for value in sorted(domains)[:8]]
        more = f" and {len(domains) - 8} more" if len(domains) > 8 else ""
        return ", ".join(shown) + more if shown else f"no node carries the label {label!r}"

    whole = _sum(workers)
    # The most free first (ties in the nodes' order). A domain whose free resources do not add up to
    # the gang, or that found no room for its shape earlier in the round, is passed over; one that
    # places it now could fit it ever.
    for value in sorted(domains, key=lambda v: _order_key(frees[v])):
        if not _fits(whole, frees[value]) or ("no room in", value, *shape) in cluster._memo:
            continue
        placed = fits(domains[value], free=True)
        if placed is None:
            cluster._memo[("no room in", value, *shape)] = True
        elif (admission := _with_driver(placed, cluster, driver, need)) is not None:
            admission.reason += f" inside {label}={value}"
            admission.selector = {label: value}
            return admission
    ever = cluster._kept(("ever", *shape), lambda: any(fits(ix, free=False) is not None for ix in domains.values()))
    if required and not ever:
        return Admission(
            Decision.infeasible,
            f"can never fit inside one {label}: needs {need}; in all: {seen(free=False)}."
            f" Label more nodes (ray start --labels {label}=...), or ask for fewer.",
        )
    if required:
        return Admission(Decision.wait, f"waiting for room inside one {label}: needs {need}; free: {seen(free=True)}")
    anywhere = admit(scaling.model_copy(update={"topology": None}), cluster, driver)
    if anywhere.decision is Decision.admit:
        anywhere.reason += f" across {label}s (no single {label} had room: {seen(free=True)})"
    return anywhere


def _domains(cluster: ClusterCapacity, label: str, frees: dict[str, dict[str, Resources]]) -> dict[str, list[int]]:
    """The node indices of each value of `label`, in the nodes' order; each value's free resources
    go into `frees[label]` (one pass over the nodes for both)."""
    domains: dict[str, list[int]] = {}
    sums: dict[str, Resources] = {}
    for index, node in enumerate(cluster.nodes):
        if (value := node.labels.get(label)) is not None:
            domains.setdefault(value, []).append(index)
            free = sums.setdefault(value, {})
            for name, amount in node.free.items():
                free[name] = free.get(name, 0.0) + amount
    frees[label] = sums
    return domains


def _with_driver(
    placed: dict[int, list[Resources]], cluster: ClusterCapacity, driver: Resources, need: str
) -> Admission | None:
    """The workers' placement plus the driver's bundle on a node with room left, as by-node-id bundles."""
    by_node = {cluster.nodes[index].node_id: list(bundles) for index, bundles in placed.items()}
    if any(amount > 0 for amount in driver.values()):
        taken = {index: _sum(bundles) for index, bundles in placed.items()}  # only these nodes' room changed

        def room(index: int) -> Resources:
            free = cluster.nodes[index].free
            used = taken.get(index)
            return free if used is None else {name: free.get(name, 0.0) - used.get(name, 0.0) for name in free}

        spot = next((index for index in range(len(cluster.nodes)) if _fits(driver, room(index))), None)
        if spot is None:
            return None
        by_node.setdefault(cluster.nodes[spot].node_id, []).append(dict(driver))
    return Admission(Decision.admit, f"fits: {need}", by_node)


def nodes_free(cluster: ClusterCapacity, limit: int = 8, *, free: bool = True) -> str:
    """Each node's free (or total) resources, the most first, for reasons a person reads. Free
    resources are ranked in the order placement tries the nodes (`ClusterCapacity.free_order`, kept by
    `reserve`), so a reason costs `limit` nodes, not a pass over all of them."""

    def amounts(node: Node) -> Resources:
        return node.free if free else node.total

    if free:
        ranked = [cluster.nodes[index] for _, index in cluster._free_keys()[:limit]]
    else:
        # nsmallest is sorted(...)[:limit] (ties keep the nodes' order) without sorting every node.
        ranked = heapq.nsmallest(
            limit, cluster.nodes, key=lambda n: (-amounts(n).get("GPU", 0.0), -amounts(n).get("CPU", 0.0))
        )
    shown = [f"{node.label} {_fmt(amounts(node))}" for node in ranked]
    more = f" and {len(cluster.nodes) - limit} more" if len(cluster.nodes) > limit else ""
    return ", ".join(shown) + more if shown else "no nodes"


def describe(spec: JobSpec | Scaling) -> str:
    scaling = _scaling(spec)
    per_worker = scaling.worker_resources()
    n = scaling.min_workers
    parts = [f"{_num(amount * n)} {name}" for name, amount in per_worker.items() if name != "memory"]
    where = ""
    if scaling.topology is not None:
        where = f" inside one {scaling.topology.required}" if scaling.topology.required else ""
    if scaling.elastic:
        where += f" (elastic: {n} to {scaling.max_workers} workers)"
    return f"{', '.join(parts)} as {n} x {_fmt(per_worker)} {scaling.placement_strategy.value}{where}"


def _scaling(spec: JobSpec | Scaling) -> Scaling:
    return spec.scaling if isinstance(spec, JobSpec) else spec


def _place(
    bundles: list[Resources],
    capacities: list[Resources],
    strategy: PlacementStrategy,
    n_workers: int,
    keys: list[tuple[float, int]] | None = None,
) -> dict[int, list[Resources]] | None:
    """First-fit-decreasing placement; None when the bundles cannot be placed.

    `keys` is (`_order_key` of each capacity, its index), sorted (ties by index): the order nodes
    are tried in, when the caller keeps it (`ClusterCapacity._free_keys`); otherwise it is sorted here. A
    node's capacity is copied only when a bundle is taken from it."""
    if not capacities:
        return None
    if keys is None:
        keys = _sorted_keys(capacities)
    left: dict[int, Resources] = {}
    if strategy is PlacementStrategy.STRICT_PACK:
        whole = _sum(bundles)
        for index in _with_room(keys, whole):
            if _fits(whole, capacities[index]):
                return {index: list(bundles)}
        return None
    placement: dict[int, list[Resources]] = {}
    # A node too small for a bundle stays too small for the same bundle again (free resources only
    # shrink here): a gang's identical workers skip the nodes an earlier worker found too small.
    too_small: set[int] = set()
    previous: Resources | None = None
    for position, bundle in enumerate(sorted(bundles, key=lambda b: -b.get("GPU", 0.0) - b.get("CPU", 0.0) / 1e3)):
        if bundle != previous:
            too_small, previous = set(), bundle
        candidates: Iterable[int]
        if strategy is PlacementStrategy.STRICT_SPREAD and position < n_workers:
            candidates = _with_room(keys, bundle, placement)
        elif strategy is PlacementStrategy.SPREAD:
            # The nodes holding fewest of the gang's bundles first, each group in the keys' order:
            # nodes holding none are the keys less the placed ones; the placed ones are a few.
            placed = sorted(placement, key=lambda i: (len(placement[i]), _order_key(capacities[i]), i))
            candidates = itertools.chain(_with_room(keys, bundle, placement), placed)
        else:
            candidates = _with_room(keys, bundle)
        for index in candidates:
            if index in too_small:
                continue
            if _fits(bundle, left.get(index, capacities[index])):
                if index not in left:
                    left[index] = dict(capacities[index])
                _take(bundle, left[index])
                placement.setdefault(index, []).append(bundle)
                break
            too_small.add(index)
        else:
            return None
    return placement


def _with_room(
    keys: list[tuple[float, int]], bundle: Resources, skip: Mapping[int, object] | None = None
) -> Iterator[int]:
    """The node indices of `keys` (sorted, the most room first) up to the first node whose key shows
    it has too little GPU and CPU together for `bundle`: no node after it can hold the bundle either.
    On a full cluster of a thousand nodes this ends the scan after the few nodes with room. Nodes in
    `skip` (those a STRICT_SPREAD or SPREAD gang already uses) are passed over."""
    bound = _order_key(bundle) + 1e-6  # a node that fits has a key at most this
    for key, index in keys:
        if key > bound:
            return
        if skip is None or index not in skip:
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
