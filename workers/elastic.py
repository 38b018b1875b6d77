"""An elastic gang's scaling policy: Ray Train's own, capped by the platform.

Ray Train grows an elastic gang toward its `max` when the cluster has room, and shrinks it only when
workers are lost; nothing outside the run can ask it to shrink. A dispatcher that makes room for a
higher-priority job shrinks elastic gangs first (api/dispatcher/preemption.py, `shrink_to`), so the
policy here, run in the job's Ray Train controller, reads that cap from `GET /v1/jobs/{id}/control`
(through the process's one control poller, trainmaster/control.py) and counts no more workers than
it: Ray Train's own running-group check then decides a resize, and the group restarts smaller from
its latest checkpoint, in the same attempt.

A lost node: Ray Train restarts the group at the size its autoscaling coordinator reserves, and the
coordinator keeps a node in its reservation until Ray declares the node dead (its health checks fail for
a while). Restarted at the old size, the group cannot be placed and waits out Ray Train's start timeout
(`RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`, 60 s) before it restarts smaller. So the policy counts only
reserved nodes whose raylet answers a TCP connection (refused at once when the raylet is gone, and a
1 s timeout when its host is). And it does not wait for Ray to see the loss: at each of Ray Train's
health checks of a running group (every 2 s) the group's nodes are probed, and a group with a worker on
one that does not answer restarts at once on what is left (at least its `min`).

`install()` makes Ray Train's trainer build this policy for elastic runs (the driver calls it before
`fit()`); tests/unit/test_elastic_policy.py checks Ray still builds policies where this hooks in.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy, ScalingPolicy, create_scaling_policy
from ray.train.v2._internal.util import time_monotonic
from ray.train.v2.api import data_parallel_trainer

from trainmaster.control import max_workers


class CappedElasticPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy, never counting more workers than the platform's cap, nor any on a node
    whose raylet does not answer; and a running group with a worker on such a node is resized at once."""

    def _count_possible_workers(self, reserved_resources: Any) -> int:
        return self._count_on(reserved_resources, answering(set(reserved_resources)))

    def _count_on(self, reserved_resources: Any, live: set[str]) -> int:
        """Ray's count over the reserved nodes in `live`, within the platform's cap."""
        possible: int = super()._count_possible_workers({n: r for n, r in reserved_resources.items() if n in live})
        cap = max_workers()  # the control poller's last answer (trainmaster/control.py): no request here
        return possible if cap is None else min(possible, max(cap, self.scaling_config.min_workers))

    def make_decision_for_running_worker_group(self, worker_group_state: Any, worker_group_status: Any) -> Any:
        """Ray Train asks at each health check of the running group (every 2 s); its policy considers a
        resize once per `elastic_resize_monitor_interval_s` (60 s by default), which is right for growing
        (each resize restarts the group from its checkpoint) but leaves a group with a worker on a dead node
        waiting for Ray to fail that worker's health check (15-20 s). A lost node is looked for at every
        check: the group restarts at once on what answers, if that is its `min` or more."""
        nodes = {worker.metadata.node_id for worker in worker_group_state.workers}
        live = answering(nodes)
        if nodes - live and (reserved := self._get_reserved_resources()) is not None:
            # The group's nodes were just probed: only the other reserved ones are.
            possible = self._count_on(reserved, live | answering(set(reserved) - nodes))
            if self.scaling_config.min_workers <= possible < worker_group_state.num_workers:
                self._latest_monitor_time = time_monotonic()
                return self._get_resize_decision(possible)
        return super().make_decision_for_running_worker_group(worker_group_state, worker_group_status)


PROBE_TIMEOUT_S = 1.0
_raylets: dict[str, tuple[str, int]] = {}  # node id -> its raylet's address, as Ray listed it alive


def answering(node_ids: set[str]) -> set[str]:
    """The nodes of `node_ids` that Ray listed alive and whose raylet accepts a TCP connection now. Ray is
    asked for the addresses only of nodes not seen before (a running group's are probed every 2 s)."""
    if not node_ids or not ray.is_initialized():
        return node_ids
    if node_ids - _raylets.keys():
        for n in ray.nodes():
            if n.get("Alive"):
                _raylets[n["NodeID"]] = (n["NodeManagerAddress"], int(n["NodeManagerPort"]))
    listed = {node_id: _raylets[node_id] for node_id in node_ids if node_id in _raylets}
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(listed)))) as pool:
        return {node_id for node_id, ok in zip(listed, pool.map(accepts, listed.values()), strict=True) if ok}


def accepts(address: tuple[str, int]) -> bool:
    """Whether something accepts a TCP connection at `address` within PROBE_TIMEOUT_S."""
    try:
        with socket.create_connection(address, timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def scaling_policy(scaling_config: Any) -> ScalingPolicy:
    """What Ray Train's `create_scaling_policy` builds, with the capped policy for elastic runs."""
    if scaling_config.elasticity_enabled:
        return CappedElasticPolicy(scaling_config)
    return create_scaling_policy(scaling_config)


def install() -> None:
    """Ray Train's trainers build their scaling policy through this module's `scaling_policy`."""
    data_parallel_trainer.create_scaling_policy = scaling_policy
