"""Past one box: a Ray head and worker nodes on this machine, each its own raylet with its own
resources, under the real API and dispatcher processes.

The cluster is shared by the module: a head with 1 CPU and two worker nodes with 1 CPU each (the
machine has 2 cores; Ray counts the CPUs it is told), the head in rack a and the two others in rack b
(`ray start --labels`). Tests that need more add nodes and remove them.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack, running_stack, wait_until
from tests.e2e.ray_stack import MultiNode, start_ray_head
from tests.factories.jobs import TERMINAL, small_mlp, wait_for_status

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster() -> Iterator[MultiNode]:
    multi = MultiNode(start_ray_head(num_cpus=1, labels={"rack": "a"}))
    try:
        for index in (1, 2):
            multi.add_node(1, {f"tm_node_{index}": 1}, labels={"rack": "b"})
        yield multi
    finally:
        multi.stop()


@pytest.fixture(scope="module")
def mstack(pg_server_url: str, cluster: MultiNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # A gang that can never fit waits for the cluster to grow instead of failing within seconds.
    # An elastic gang considers growing every 3 s (Ray Train's default is 60).
    extra = {"TRAINMASTER_INFEASIBLE_TIMEOUT_S": "600", "TRAINMASTER_ELASTIC_RESIZE_INTERVAL_S": "3"}
    with running_stack(pg_server_url, cluster.head, tmp_path_factory.mktemp("multinode"), extra) as running:
        yield running


def started_events(client: tm.Client, job_id: str) -> list[Any]:
    return [e for e in client.events(job_id) if e.kind == "workers_started"]


def all_cpus_free(cluster: MultiNode) -> None:
    wait_until(
        lambda: cluster.head.free_cpus() == cluster.head.total_cpus(), 90, interval=0.5, what="every CPU free again"
    )


SPREAD_SCRIPT = textwrap.dedent(
    """
    import os, socket
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} ran {os.path.basename(__file__)}"
          f" on {socket.gethostname()}: sum {total.item():g}", flush=True)
    dist.destroy_process_group()
    """
)


def test_strict_spread_gang_runs_one_worker_per_node_with_the_uploaded_code(
    mstack: Stack, cluster: MultiNode, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "spread.py").write_text(SPREAD_SCRIPT)
    with mstack.client() as client:
        nodes = client.cluster().nodes
        assert len(nodes) == 3 and {n.node_id for n in nodes} == set(cluster.node_ids())
        job = client.submit(
            name="spread-3",
            entrypoint="script:spread.py",
            working_dir=code,
            scaling=tm.Scaling(num_workers=3, placement_strategy="STRICT_SPREAD"),
        )
        done = wait_for_status(client, job.id, TERMINAL, timeout=300)
        assert done.status is tm.JobStatus.succeeded, done.error
        [started] = started_events(client, job.id)
        workers = started.data["workers"]
        assert sorted(w["rank"] for w in workers) == [0, 1, 2]
        assert len({w["node_id"] for w in workers}) == 3, workers  # one worker on each node
        assert {w["node_id"] for w in workers} == set(cluster.node_ids())
        lines = [line.line for line in client.logs(job.id)]
        ran = [line for line in lines if "ran spread.py" in line]
        for rank in range(3):  # each node ran the uploaded script and its output was stored
            assert any(re.search(rf"rank {rank} of 3 ran spread.py .*: sum 6", line) for line in ran), ran
        statuses = [e.status.value for e in client.events(job.id) if e.status]
        assert statuses == ["queued", "starting", "running", "succeeded"]
    all_cpus_free(cluster)


def test_a_rack_bound_gang_lands_in_its_rack_while_a_gang_fitting_no_node_waits_for_one_to_join(
    mstack: Stack, cluster: MultiNode
) -> None:
    with mstack.client() as client:
        # scaling.topology: 2 workers inside one rack fit only rack b (rack a is the head's one CPU).
        racked = client.submit(
            name="rack-2",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=2, topology=tm.Topology(required="rack")),
            config=small_mlp(epochs=1),
        )
        job = client.submit(
            name="pack-2",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=2, placement_strategy="STRICT_PACK"),
            config=small_mlp(epochs=1),
        )
        waiting = wait_until(
            lambda: (r := client.get(job.id).info.pending_reason) and "can never fit" in r and r,
            60,
            interval=0.5,
            what="the per-node reason",
        )
        assert "on 3 node(s): " in waiting, waiting
        assert len(re.findall(r"/[0-9a-f]{8} \{CPU: 1[,}]", waiting)) == 3, waiting  # each node's room
        assert client.get(job.id).status is tm.JobStatus.queued
        bigger = cluster.add_node(2, {"tm_big": 1})  # the cluster grows: the gang fits on the new node
        try:
            done = wait_for_status(client, job.id, TERMINAL, timeout=300)
            assert done.status is tm.JobStatus.succeeded, done.error
            assert [a.n for a in done.attempts] == [1]  # admitted as it was, never resubmitted
            [started] = started_events(client, job.id)
            assert len({w["node_id"] for w in started.data["workers"]}) == 1
            placed = wait_for_status(client, racked.id, TERMINAL, timeout=300)
            assert placed.status is tm.JobStatus.succeeded, placed.error
            [racked_started] = started_events(client, racked.id)
            rack_b = set(cluster.node_ids(rack="b"))
            assert len(rack_b) == 2 and {w["node_id"] for w in racked_started.data["workers"]} == rack_b
            admitted = [e.message or "" for e in client.events(racked.id) if e.status is tm.JobStatus.starting]
            assert admitted and admitted[0].endswith("inside rack=b"), admitted
        finally:
            all_cpus_free(cluster)
            cluster.stop_node(bigger)


@pytest.fixture
def fault_nodes(cluster: MultiNode) -> Iterator[dict[str, Path]]:
    """Two nodes that each fit the whole 2-worker gang: whichever dies, the other takes the group.
    Both are removed afterwards, and every CPU is free again."""
    before = set(cluster.node_ids())
    folders: dict[str, Path] = {}
    try:
        for _ in range(2):
            folder = cluster.add_node(1, {"tm_fault": 2})
            [node_id] = set(cluster.node_ids()) - before - set(folders)
            folders[node_id] = folder
        yield folders
    finally:
        for folder in folders.values():
            cluster.stop_node(folder)
    all_cpus_free(cluster)


def run_until_checkpoint_then_kill_a_node(
    client: tm.Client, cluster: MultiNode, folders: dict[str, Path], max_failures: int
) -> tuple[str, str]:
    job = client.submit(
        name=f"node-loss-{max_failures}",
        entrypoint="builtin:mlp",
        scaling=tm.Scaling(
            num_workers=2, placement_strategy="SPREAD", resources_per_worker={"CPU": 0.5, "tm_fault": 1}
        ),
        config=small_mlp(epochs=8, epoch_sleep_s=2),
        max_failures=max_failures,
    )
    wait_until(lambda: client.checkpoints(job.id), 240, interval=0.5, what="a checkpoint registered")
    [started] = started_events(client, job.id)
    victim = next(w["node_id"] for w in started.data["workers"] if w["node_id"] in folders)
    cluster.kill_raylet(folders[victim])
    return job.id, victim


def test_node_lost_without_failures_left_fails_naming_the_node(
    mstack: Stack, cluster: MultiNode, fault_nodes: dict[str, Path]
) -> None:
    with mstack.client() as client:
        job_id, victim = run_until_checkpoint_then_kill_a_node(client, cluster, fault_nodes, 0)
        done = wait_for_status(client, job_id, TERMINAL, timeout=300)
        assert done.status is tm.JobStatus.failed
        assert victim[:8] in (done.error or ""), done.error


def test_an_elastic_gang_grows_when_a_node_joins_and_shrinks_when_one_dies_in_the_same_attempt(
    mstack: Stack, cluster: MultiNode
) -> None:
    """Issue 29: `{min: 1, max: 2}`, one worker per `tm_elastic` node. It starts on the one such node,
    grows to 2 when a second joins (the stack's resize interval is 3 s), and after a checkpoint the node
    of one worker dies: Ray Train's elastic policy restarts the group on the node left, resumed from the
    checkpoint (max_failures left 0: an elastic gang restarts smaller all the same), in one attempt.
    Each resize is an event (from, to, why). This is also the test of a node lost mid-job that the attempt
    survives (the resize names the node, the new group avoids it, it resumes from the checkpoint): a fixed
    gang's restart within its attempt is tests/reliability/test_ray_faults.py's killed worker."""
    scaling = tm.Scaling.model_validate(
        {
            "num_workers": {"min": 1, "max": 2},
            "placement_strategy": "SPREAD",
            "resources_per_worker": {"CPU": 0.5, "tm_elastic": 1},  # a tm_elastic node holds one worker
        }
    )
    folders: dict[str, Path] = {}  # node id -> its folder

    def add_elastic_node() -> None:
        before = set(cluster.node_ids())
        folder = cluster.add_node(1, {"tm_elastic": 1})
        [node_id] = set(cluster.node_ids()) - before
        folders[node_id] = folder

    add_elastic_node()
    try:
        with mstack.client() as client:
            job = client.submit(
                name="elastic", entrypoint="builtin:mlp", scaling=scaling, config=small_mlp(epochs=12, epoch_sleep_s=2)
            )
            wait_until(lambda: started_events(client, job.id), 240, interval=0.5, what="the first group to start")
            assert started_events(client, job.id)[0].data["num_workers"] == 1  # what fits: its minimum
            add_elastic_node()  # as `trainmaster join` on a second machine

            def resized(to: int) -> Any:
                return next((e for e in client.events(job.id) if e.kind == "resized" and e.data["to"] == to), None)

            grown = wait_until(lambda: resized(2), 180, interval=0.5, what="the gang to grow to 2")
            assert grown.data["from"] == 1 and "grows the gang toward its maximum" in grown.data["why"]
            two = started_events(client, job.id)[-1]
            assert two.data["num_workers"] == 2
            seen = len(client.checkpoints(job.id))
            wait_until(lambda: len(client.checkpoints(job.id)) > seen, 240, interval=0.5, what="a checkpoint at 2")
            victim = two.data["workers"][1]["node_id"]
            cluster.kill_raylet(folders[victim])
            done = wait_for_status(client, job.id, TERMINAL, timeout=420)
            assert done.status is tm.JobStatus.succeeded, done.error
            assert [a.n for a in done.attempts] == [1]  # grown and shrunk inside the attempt, never retried
            shrunk = resized(1)
            assert shrunk is not None and shrunk.data["from"] == 2, [e.data for e in client.events(job.id)]
            assert "lost" in shrunk.data["why"] and victim[:8] in shrunk.data["why"], shrunk.data
            # Whichever of Ray Train's checks saw the loss first (a worker's health, or the node's raylet
            # gone from the elastic policy's count), the loss is a `workers_lost` event naming the node.
            assert any(e.kind == "workers_lost" and victim[:8] in e.message for e in client.events(job.id))
            assert all(w["node_id"] != victim for w in started_events(client, job.id)[-1].data["workers"])
            assert any(e.kind == "resumed" for e in client.events(job.id))  # from a checkpoint, not from scratch
    finally:
        for folder in folders.values():
            cluster.stop_node(folder)
        all_cpus_free(cluster)
