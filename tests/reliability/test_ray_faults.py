"""Cases 5 and 6: a Ray Train worker SIGKILLed after checkpoint k, and the Ray head restarted under a
running job (whose logs are then read again once the cluster is gone).

Real Ray, real processes; launches counted from the training code's own ledger."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import trainmaster as tm
from tests.e2e.conftest import TRAINMASTER, Stack, running_stack, wait_until
from tests.e2e.ray_stack import start_ray_head, stop_ray_head
from tests.factories.jobs import TERMINAL, ledger_lines, small_mlp, wait_for_status

pytestmark = pytest.mark.ray

K = 1  # the checkpoint after which a worker dies


def worker_pid_after_checkpoint(progress: Path, rank: int, epoch: int) -> int | None:
    for line in progress.read_text().splitlines() if progress.exists() else []:
        pid, *fields = line.split()
        if f"rank={rank}" in fields and f"epoch={epoch}" in fields:
            return int(pid)
    return None


@pytest.mark.parametrize("max_failures", [1, 0])
def test_worker_killed_after_a_checkpoint(stack: Stack, tmp_path: Path, max_failures: int) -> None:
    progress, ledger = tmp_path / "progress.txt", tmp_path / "ledger.txt"
    with stack.client() as client:
        job = client.submit(
            name=f"kill-worker-{max_failures}",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=2),
            max_failures=max_failures,
            config=small_mlp(epochs=4, epoch_sleep_s=1.5, progress_path=str(progress), ledger_path=str(ledger)),
        )
        # "After checkpoint k" means Ray Train registered it: the controller's callback records it here.
        wait_until(lambda: any(c.step == K for c in client.checkpoints(job.id)), 240, what=f"checkpoint {K}")
        pid = worker_pid_after_checkpoint(progress, 1, K)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        done = wait_for_status(client, job.id, TERMINAL, timeout=300)
        if max_failures:
            assert done.status is tm.JobStatus.succeeded, done.error
            assert [(line[1], line[3]) for line in ledger_lines(ledger)] == [
                ("1", "start_epoch=0"),
                ("1", f"start_epoch={K + 1}"),
            ]
        else:
            assert done.status is tm.JobStatus.failed
            assert done.error and len(done.error) > 10
            with pytest.raises(tm.JobFailed) as caught:
                client.wait(job.id, timeout=5)
            assert done.error in str(caught.value)
            shown_run = subprocess.run(
                [TRAINMASTER, "get", job.id],
                capture_output=True,
                text=True,
                timeout=60,
                env={
                    **os.environ,
                    "TRAINMASTER_API_URL": stack.api.url,
                    "TRAINMASTER_TOKEN": stack.api.token,
                    "COLUMNS": "400",
                },
            )
            assert done.error.splitlines()[0][:60] in shown_run.stdout, shown_run.stderr
    wait_until(lambda: stack.ray.free_cpus() == stack.ray.total_cpus(), 60, interval=0.5, what="every CPU free again")
    from ray.util.state import list_placement_groups

    assert all(group.state == "REMOVED" for group in list_placement_groups(address=stack.ray.dashboard))


def test_ray_head_restart_under_a_running_job(pg_server_url: str, tmp_path: Path) -> None:
    progress, ledger = tmp_path / "progress.txt", tmp_path / "ledger.txt"
    head: Any = start_ray_head(num_cpus=2)
    bound = {"TRAINMASTER_RAY_UNREACHABLE_TIMEOUT_S": "30"}
    try:
        with running_stack(pg_server_url, head, tmp_path, extra_env=bound) as stack, stack.client() as client:
            job = client.submit(
                name="head-restart",
                entrypoint="builtin:mlp",
                scaling=tm.Scaling(num_workers=1),
                max_retries=1,
                config=small_mlp(epochs=5, epoch_sleep_s=1.5, progress_path=str(progress), ledger_path=str(ledger)),
            )
            wait_until(lambda: client.checkpoints(job.id), 240, what="the first checkpoint, registered by Ray Train")
            ports, token = head.ports(), head.headers()["Authorization"].split()[1]
            stop_ray_head(head)
            head = start_ray_head(num_cpus=2, ports=ports, token=token)

            def left_running() -> tm.Job | None:
                info = client.get(job.id).info
                return info if info.attempts[0].status == "lost" else None

            lost = wait_until(left_running, 90, what="the running attempt to be declared lost")
            assert "Ray" in (lost.attempts[0].error or "")
            done = wait_for_status(client, job.id, TERMINAL, timeout=300)
            assert done.status is tm.JobStatus.succeeded, done.error
            assert [(a.n, a.status) for a in done.attempts] == [(1, "lost"), (2, "succeeded")]
            from ray.job_submission import JobSubmissionClient

            on_new_head = {
                j.submission_id for j in JobSubmissionClient(head.dashboard, headers=head.headers()).list_jobs()
            }
            assert f"tm-{job.id}-2" in on_new_head and f"tm-{job.id}-1" not in on_new_head

            # Logs outlive the Ray cluster: read the same after it is gone for good.
            before = [line.line for line in client.logs(job.id)]
            stop_ray_head(head)
            after = [line.line for line in client.logs(job.id)]
            assert after == before
            assert any(f"[trainmaster] job {job.id} attempt 2" in line for line in after), after
            assert any("epoch 4: loss" in line for line in after), after  # a worker's own print
        starts = [line[3] for line in ledger_lines(ledger)]
        assert starts[0] == "start_epoch=0" and starts[-1] != "start_epoch=0"  # the retry resumed
    finally:
        stop_ray_head(head)
