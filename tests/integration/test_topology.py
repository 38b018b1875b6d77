"""Topology through real admission rounds on PostgreSQL (the exact fake Ray of tests/factories/ray.py,
its nodes labelled): the domain admission chose is stored on the attempt and handed to the driver
(TRAINMASTER_LABEL_SELECTOR, which it gives Ray Train as ScalingConfig.label_selector), again when
the launch is submitted a second time; a gang no rack has room for waits, saying so. The real-Ray path
is tests/e2e/test_multinode.py."""

from __future__ import annotations

import json

from api.dispatcher.placement import ClusterCapacity, Node
from tests.factories.world import World, run
from trainmaster.context import ENV_LABEL_SELECTOR
from trainmaster.models import JobStatus


def labelled(free_a: float, free_b: float = 1.0) -> ClusterCapacity:
    nodes = [("a1", "a", free_a), ("a2", "a", free_a), ("b1", "b", free_b), ("b2", "b", free_b)]
    return ClusterCapacity(
        [Node(name, {"CPU": 1.0}, {"CPU": free}, labels={"rack": rack}) for name, rack, free in nodes]
    )


def test_the_chosen_rack_goes_with_every_launch_of_the_attempt(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            world.ray.cluster = lambda: labelled(free_a=0.5)  # type: ignore[method-assign]
            world.ray.refuse_submit = True  # the first submit fails: reconcile submits it again
            two = {"scaling": {"num_workers": 2, "topology": {"required": "rack"}}}
            job_id = await world.submit("alpha", **two)
            assert await world.dispatcher().admit_round() == 1
            [attempt] = await world.attempts(job_id)
            assert attempt.selector == {"rack": "b"}  # rack a's nodes have half a CPU each free
            admitted = [e.message for e in await world.events(job_id) if e.status == JobStatus.starting]
            assert admitted == [f"admitted; attempt 1 ({attempt.ray_submission_id}) inside rack=b"]

            world.ray.refuse_submit = False
            await world.dispatcher().reconcile_round()
            launched = world.ray.launches[attempt.ray_submission_id]
            assert json.loads(launched.runtime_env["env_vars"][ENV_LABEL_SELECTOR]) == {"rack": "b"}

            world.ray.cluster = lambda: labelled(free_a=0.5, free_b=0.0)  # type: ignore[method-assign]
            other = await world.submit("alpha", **two)
            await world.dispatcher().admit_round()  # b is taken by the first, a has half a CPU per node
            waiting = await world.job(other)
            assert waiting.status is JobStatus.queued
            assert (waiting.pending_reason or "").startswith("waiting for room inside one rack"), waiting.pending_reason
            assert "rack=a {CPU: 1}, rack=b {CPU: 0}" in (waiting.pending_reason or "")

    run(scenario())
