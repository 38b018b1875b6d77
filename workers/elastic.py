"""An elastic gang's scaling policy: Ray Train's own, capped by the platform.

Ray Train grows an elastic gang toward its `max` when the cluster has room, and shrinks it only when
workers are lost; nothing outside the run can ask it to shrink. A dispatcher that makes room for a
higher-priority job shrinks elastic gangs first (api/dispatcher/preemption.py, `shrink_to`), so the
policy here, run in the job's Ray Train controller, reads that cap from `GET /v1/jobs/{id}/control`
(through the process's one control poller, trainmaster/control.py) and counts no more workers than
it: Ray Train's own running-group check then decides a resize, and the group restarts smaller from
its latest checkpoint, in the same attempt.

`install()` makes Ray Train's trainer build this policy for elastic runs (the driver calls it before
`fit()`); tests/unit/test_elastic_policy.py checks Ray still builds policies where this hooks in.
"""

from __future__ import annotations

from typing import Any

from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy, ScalingPolicy, create_scaling_policy
from ray.train.v2.api import data_parallel_trainer

from trainmaster.control import max_workers


class CappedElasticPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy, never counting more workers than the platform's cap."""

    def _count_possible_workers(self, reserved_resources: Any) -> int:
        possible: int = super()._count_possible_workers(reserved_resources)
        cap = max_workers()  # the control poller's last answer (trainmaster/control.py): no request here
        return possible if cap is None else max(min(possible, cap), self.scaling_config.min_workers)


def scaling_policy(scaling_config: Any) -> ScalingPolicy:
    """What Ray Train's `create_scaling_policy` builds, with the capped policy for elastic runs."""
    if scaling_config.elasticity_enabled:
        return CappedElasticPolicy(scaling_config)
    return create_scaling_policy(scaling_config)


def install() -> None:
    """Ray Train's trainers build their scaling policy through this module's `scaling_policy`."""
    data_parallel_trainer.create_scaling_policy = scaling_policy
