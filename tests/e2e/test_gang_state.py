"""What the dispatcher reads of a driver's placement groups from a real Ray head (the session's, 4 CPUs):
a group Ray can place is CREATED; one it cannot is PENDING with Ray's own scheduling reason, which a job
put back in the queue shows (api/dispatcher/reconcile.py, `_unplaced`; its rules with the fake Ray in
tests/integration/test_containment.py). A driver whose newest group waits while an older one is placed
(a group Ray Train did not remove) is pending, not placed."""

from __future__ import annotations

from typing import Any

from api.dispatcher.backend import GangState, Launch
from api.dispatcher.ray_jobs import RayJobsBackend
from tests.factories.waiting import wait_until

DRIVER = (
    "python -c \"import ray, time; ray.init(); pg = ray.util.placement_group([{{'CPU': {cpus}}}]);"
    " print('group made', flush=True); time.sleep(120)\""
)
# An older group placed, then a newer one Ray cannot place: the gang Ray Train waits for is the newer.
STALE_THEN_PENDING = (
    "python -c \"import ray, time; ray.init(); old = ray.util.placement_group([{'CPU': 1}]); ray.get(old.ready());"
    " new = ray.util.placement_group([{'CPU': 64}]); table = ray.util.placement_group_table;"
    " [time.sleep(0.1) for _ in range(100) if table(new).get('state') != 'PENDING'];"
    " print('group made', flush=True); time.sleep(120)\""
)


def test_a_pending_group_says_why_and_a_placed_one_is_placed(ray_head: Any) -> None:
    ray = RayJobsBackend(ray_head.dashboard, token=ray_head.token_path.read_text().strip())
    launches = {
        cpus: Launch(submission_id=f"gang-state-{cpus}", entrypoint=DRIVER.format(cpus=cpus)) for cpus in (64, 1)
    }
    launches[0] = Launch(submission_id="gang-state-stale", entrypoint=STALE_THEN_PENDING)
    for launch in launches.values():
        assert ray.submit(launch)
    try:

        def state(cpus: int) -> GangState | None:
            info = ray.info(launches[cpus].submission_id)
            if info is None or not info.driver_job_id or "group made" not in ray.logs(launches[cpus].submission_id):
                return None
            found = ray.gang_state(info.driver_job_id)
            return found if found.placed or found.pending else None

        stuck = wait_until(lambda: state(64), 120, interval=0.5, what="the 64-CPU group to be reported")
        assert not stuck.placed and stuck.pending is not None
        assert stuck.pending.startswith("Ray: ") and any(
            word in stuck.pending for word in ("INFEASIBLE", "NO_RESOURCES", "QUEUED", "SCHEDULING")
        ), stuck.pending
        placed = wait_until(lambda: state(1), 120, interval=0.5, what="the 1-CPU group to be placed")
        assert placed.placed and placed.pending is None

        def pending_behind() -> GangState | None:
            # Ray's list may show the new group a moment after the driver saw it PENDING: until then
            # the older group is all there is, and the gang reads placed. Pending it must become.
            found = state(0)
            return found if found is not None and found.pending is not None else None

        behind = wait_until(pending_behind, 120, interval=0.5, what="the stale group's job to read pending")
        assert not behind.placed and behind.pending is not None
        assert "1 earlier placement group(s) of this job still hold their bundles" in behind.pending, behind.pending
    finally:
        for launch in launches.values():
            ray.stop(launch.submission_id)
