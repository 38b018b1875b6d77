"""The one fault-injection seam: a Ray backend that SIGKILLs the dispatcher at a named point.

The reliability suite sets TRAINMASTER_FAULT_POINT for a dispatcher it means to kill; `main` then
wraps the real backend in `DyingRay`. Nothing in the admission, launch or reconcile code knows
about faults. The points, all on the dispatcher's boundary with Ray:
- after_claim: an attempt row is committed and Ray is about to hear of it (dies before submit).
- after_submit: Ray runs the attempt, the attempt row is not marked yet (dies after submit).
- while_reconciling: Ray has answered for an active attempt, nothing was applied (dies after info).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from api.dispatcher.backend import GangState, Launch, RayBackend, RayJobInfo
from api.dispatcher.placement import ClusterCapacity

ENV_FAULT_POINT = "TRAINMASTER_FAULT_POINT"
POINTS = ("after_claim", "after_submit", "while_reconciling")


@dataclass
class DyingRay:
    ray: RayBackend
    point: str

    def _die_at(self, point: str) -> None:
        if self.point == point:
            os.kill(os.getpid(), signal.SIGKILL)

    def cluster(self) -> ClusterCapacity:
        return self.ray.cluster()

    def submit(self, launch: Launch) -> bool:
        self._die_at("after_claim")
        started = self.ray.submit(launch)
        self._die_at("after_submit")
        return started

    def info(self, submission_id: str) -> RayJobInfo | None:
        info = self.ray.info(submission_id)
        self._die_at("while_reconciling")
        return info

    def stop(self, submission_id: str) -> None:
        self.ray.stop(submission_id)

    def gang_state(self, driver_job_id: str) -> GangState:
        return self.ray.gang_state(driver_job_id)

    def logs(self, submission_id: str, offset: int = 0, final: bool = False) -> str:
        return self.ray.logs(submission_id, offset, final)


def with_faults(ray: RayBackend) -> RayBackend:
    """`ray` itself, unless TRAINMASTER_FAULT_POINT names a point to die at."""
    point = os.environ.get(ENV_FAULT_POINT)
    if not point:
        return ray
    if point not in POINTS:
        raise ValueError(f"{ENV_FAULT_POINT}={point!r} is not one of {', '.join(POINTS)}")
    return DyingRay(ray, point)
