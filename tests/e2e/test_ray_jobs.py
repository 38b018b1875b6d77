"""Jobs through the whole stack on a real Ray head: API process, dispatcher process(es), TorchTrainer.

A real 2-worker TorchTrainer run takes 20-40 s on a 2-core machine, so each test runs few jobs and
they share one Ray head. Launches are counted from a ledger the training code appends to.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import trainmaster as tm
from tests.e2e.conftest import TRAINMASTER, Stack
from tests.factories.jobs import TERMINAL, ledger_lines, small_mlp, wait_for_status
from tests.factories.processes import json_log_lines
from tests.factories.waiting import wait_until

pytestmark = pytest.mark.ray

# Importable from here too: test_frameworks, test_preemption, test_multinode and test_ray_faults import
# them from this module (their home is tests/factories/jobs.py).


def test_two_worker_gloo_job_succeeds_and_records_backend(stack: Stack) -> None:
    with stack.client() as client:
        job = client.submit(
            name="gloo-2", entrypoint="builtin:mlp", scaling=tm.Scaling(num_workers=2), config=small_mlp()
        )
        done = wait_for_status(client, job.id, TERMINAL)
        assert done.status is tm.JobStatus.succeeded, done.error
        assert [a.ray_submission_id for a in done.attempts] == [f"tm-{job.id}-1"]
        runtime = [e for e in client.events(job.id) if e.kind == "runtime"]
        assert runtime, "no runtime event"
        assert runtime[0].data["backend"] == "gloo"
        assert runtime[0].data["world_size"] == 2
        assert runtime[0].data["device"] == "cpu"
        statuses = [e.status.value for e in client.events(job.id) if e.status]
        assert statuses == ["queued", "starting", "running", "succeeded"]
        cluster = client.cluster()
        assert cluster.reachable and cluster.total["CPU"] == stack.ray.total_cpus() and len(cluster.nodes) == 1
    # Every line the API and the dispatcher wrote is a JSON object; the job's carry its id.
    api_lines = json_log_lines(stack.api.log_path)
    dispatcher_lines = json_log_lines(stack.work_dir / "dispatcher-d1.log")
    for lines in (api_lines, dispatcher_lines):
        assert all(line.get("job_id") == job.id for raw, line in lines if job.id in raw)
    assert ("job_submitted", job.id, "e2e") in [(j["event"], j.get("job_id"), j.get("project")) for _, j in api_lines]
    dispatched = {line["event"]: line for _, line in dispatcher_lines if line.get("job_id") == job.id}
    assert (dispatched["job_launched"]["submission_id"], dispatched["job_launched"]["attempt"]) == (f"tm-{job.id}-1", 1)
    assert dispatched["job_finished"]["status"] == "succeeded"
    assert any(line["event"] == "dispatcher_started" for _, line in dispatcher_lines)


def test_drivers_after_the_first_on_a_node_are_forked_warm(stack: Stack) -> None:
    """workers/warm/ with real Ray: the first job on a node (or of a new stack) may start cold and
    starts the node's warm server; the next one is forked by it, and its driver event says so."""
    with stack.client() as client:
        events = []
        for n in range(2):
            job = client.submit(
                name=f"warm-{n}", entrypoint="builtin:toy-curve", scaling=tm.Scaling(num_workers=1), config={"steps": 3}
            )
            done = wait_for_status(client, job.id, TERMINAL)
            assert done.status is tm.JobStatus.succeeded, done.error
            events.append(next(e for e in client.events(job.id) if e.kind == "driver"))
            assert client.metrics(job.id, names=["loss"])  # the forked driver's workers reported
    first, second = events
    assert first.data["warm"] or "warm server" in first.data["cold_reason"], first.data
    assert second.data["warm"] is True, second.data
    assert "forked by the warm server" in second.message


def test_infeasible_job_says_why_and_fails(stack: Stack) -> None:
    with stack.client() as client:
        job = client.submit(
            name="needs-gpus", entrypoint="builtin:mlp", scaling=tm.Scaling(num_workers=2, use_gpu=True)
        )
        reason = wait_until(
            lambda: (
                client.get(job.id).info.pending_reason
                if "never fit" in (client.get(job.id).info.pending_reason or "")
                else None
            ),
            30,
            what="an infeasible reason",
        )
        assert "2 GPU" in reason and "Fails in" in reason
        done = wait_for_status(client, job.id, TERMINAL, timeout=60)
        assert done.status is tm.JobStatus.failed
        assert "can never fit" in (done.error or "")
        assert done.attempts == []  # never launched


def test_timeout_ends_in_timed_out(stack: Stack) -> None:
    with stack.client() as client:
        job = client.submit(
            name="too-slow",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=1),
            config=small_mlp(epochs=500, epoch_sleep_s=1),
            timeout_s=10,
        )
        done = wait_for_status(client, job.id, TERMINAL, timeout=180)
        assert done.status is tm.JobStatus.timed_out
        assert "timeout_s=10" in (done.error or "")
        assert done.attempts[-1].status == "timed_out"
    wait_until(lambda: stack.ray.free_cpus() == stack.ray.total_cpus(), 120, interval=0.5, what="CPUs to be free")


def test_failure_with_a_retry_resumes_from_the_checkpoint(stack: Stack, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    with stack.client() as client:
        job = client.submit(
            name="retry",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=2),
            # Two checkpoints before the failure; between the second and the retry's start (a second's
            # sleep, then the failure, the requeue and a new driver: seconds) the collector, a pass a second
            # here, deletes the first, which Ray's run snapshot still lists.
            config=small_mlp(epochs=3, fail_at_epoch=2, epoch_sleep_s=1, ledger_path=str(ledger)),
            max_retries=1,
            checkpoint=tm.CheckpointPolicy(num_to_keep=1),  # the collector deletes the older ones as it goes
        )
        done = wait_for_status(client, job.id, TERMINAL, timeout=360)
        assert done.status is tm.JobStatus.succeeded, done.error
        assert [a.status for a in done.attempts] == ["failed", "succeeded"]
        assert "injected failure at epoch 2" in (done.attempts[0].error or "")
        # The retry started although the checkpoint Ray's snapshot named first was gone (Ray refuses that).
        wait_until(
            lambda: any(
                "deleted since the last attempt, not resumed from: checkpoint_" in line.line
                for line in client.logs(job.id)
            ),
            30,
            interval=0.5,
            what="the retry's driver to say which checkpoints it found deleted",
        )
        assert done.attempts[1].ray_submission_id == f"tm-{job.id}-2"

        # The dispatcher's collector (api/dispatcher/checkpoint_collector.py) leaves the latest checkpoint only,
        # on disk and in the API alike; the others are listed as deleted.
        # Runs are laid out per project: `<storage>/<project id>/<job id>/`, the project's folder alone.
        [run_folder] = stack.storage.glob(f"*/{job.id}")
        assert run_folder.parent.name != job.id and not (stack.storage / job.id).exists()

        def disk_agrees() -> list[tm.CheckpointInfo] | None:
            listed = client.checkpoints(job.id)
            kept = {c.path for c in listed if c.deleted_at is None}
            on_disk = {str(p) for p in run_folder.glob("checkpoint_*") if p.is_dir()}
            return listed if len(kept) == 1 and kept == on_disk else None

        listed = wait_until(disk_agrees, 60, interval=0.5, what="the disk to hold the API's one kept checkpoint")
        assert len(listed) >= 2 and all(c.deleted_why for c in listed[:-1]) and listed[-1].deleted_at is None
        shown = subprocess.run(
            [TRAINMASTER, "checkpoints", job.id[:8], "--pin", str(listed[-1].id)],
            env={**stack.api.env, "COLUMNS": "400"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        assert "pinned" in shown.stdout and "deleted: not among the job's latest 1" in shown.stdout, shown.stdout
        assert client.checkpoints(job.id)[-1].pinned
    lines = ledger_lines(ledger)
    assert [(line[1], line[3]) for line in lines] == [("1", "start_epoch=0"), ("2", "start_epoch=2")]


def test_a_driver_that_crashes_is_queued_again_without_spending_a_retry(stack: Stack, tmp_path: Path) -> None:
    """A driver that dies of a native crash before its workers start (os.abort here: SIGABRT, as a
    failed check in Ray's core worker ends) is not the job's failure: its attempt is lost, the job is
    queued again without spending a retry (max_retries=0), and the next attempt runs."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "abort_once.py").write_text(
        "import os\n\n"
        "if os.environ.get('TRAINMASTER_ATTEMPT') == '1':\n"
        "    os.abort()  # the driver imports this module (it resolves the entrypoint) before any worker starts\n\n\n"
        "def train(config):\n"
        "    return None\n"
    )
    with stack.client() as client:
        job = client.submit(
            name="abort-once",
            entrypoint="abort_once:train",
            scaling=tm.Scaling(num_workers=1),
            working_dir=code,
            max_retries=0,
        )
        done = wait_for_status(client, job.id, TERMINAL)
        assert done.status is tm.JobStatus.succeeded, done.error
        assert [a.status for a in done.attempts] == ["lost", "succeeded"]
        assert (done.attempts[0].error or "").startswith("the job's driver crashed ("), done.attempts[0].error
        requeued = [e for e in client.events(job.id) if e.data.get("requeued") == "driver_crashed"]
        assert len(requeued) == 1 and "not a retry" in requeued[0].message


def test_two_dispatchers_launch_each_job_exactly_once(stack: Stack, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    stack.dispatchers.start("d2")
    try:
        with stack.client() as client:
            ids = [
                client.submit(
                    name=f"many-{i}",
                    entrypoint="builtin:mlp",
                    scaling=tm.Scaling(num_workers=1),
                    config=small_mlp(epochs=1, samples=64, ledger_path=str(ledger)),
                ).id
                for i in range(6)  # more jobs than fit at once (4 CPUs), so the two compete for each
            ]
            held: list[int] = []  # jobs holding the cluster, sampled while the two dispatchers admit
            stop_sampling = threading.Event()

            def sample() -> None:
                with stack.client() as sampler:
                    while not stop_sampling.wait(0.3):
                        held.append(len(list(sampler.list(status=["starting", "running", "cancelling"]))))

            watcher = threading.Thread(target=sample, daemon=True)
            watcher.start()
            deadline = time.monotonic() + 900
            try:
                for job_id in ids:
                    done = wait_for_status(client, job_id, TERMINAL, timeout=max(1, deadline - time.monotonic()))
                    assert done.status is tm.JobStatus.succeeded, done.error
                    assert len(done.attempts) == 1
            finally:
                stop_sampling.set()
                watcher.join(5)
    finally:
        stack.dispatchers.processes[-1].terminate()
    launches = Counter(line[0] for line in ledger_lines(ledger))
    assert sorted(launches) == sorted(ids)
    assert set(launches.values()) == {1}
    # 1-CPU gangs on a 4-CPU cluster: two dispatchers together never admitted more than fits.
    assert held and max(held) <= stack.ray.total_cpus(), max(held)
