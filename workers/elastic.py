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
1 s timeout when its host is): the group restarts on what is left as soon as the loss is seen.

`install()` makes Ray Train's trainer build this policy for elastic runs (the driver calls it before
`fit()`); tests/unit/test_elastic_policy.py checks Ray still builds policies where this hooks in.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy, ScalingPolicy, create_scaling_policy
from ray.train.v2.api import data_parallel_trainer

from trainmaster.control import max_workers


class CappedElasticPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy, never counting more workers than the platform's cap, nor any on a node
    whose raylet does not answer."""

    def _count_possible_workers(self, reserved_resources: Any) -> int:
        live = answering(set(reserved_resources))
        possible: int = super()._count_possible_workers({n: r for n, r in reserved_resources.items() if n in live})
        cap = max_workers()  # the control poller's last answer (trainmaster/control.py): no request here
        return possible if cap is None else min(possible, max(cap, self.scaling_config.min_workers))


PROBE_TIMEOUT_S = 1.0


def answering(node_ids: set[str]) -> set[str]:
    """The nodes of `node_ids` that Ray lists alive and whose raylet accepts a TCP connection now."""
    if not node_ids or not ray.is_initialized():
        return node_ids
    listed = {
        n["NodeID"]: (n["NodeManagerAddress"], int(n["NodeManagerPort"]))
        for n in ray.nodes()
        if n.get("Alive") and n["NodeID"] in node_ids
    }
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
