"""Every framework's example on the real CPU package: alone, then on 2 workers through the whole stack.

Each distributed run checks what the framework itself saw (its world size) and a cross-rank result (an
all-reduce of rank+1 that the framework performed: 1 + 2 = 3), read from files every rank writes.
One job per framework; they share the session's Ray head, API and dispatcher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trainmaster as tm
from tests.e2e.conftest import REPO, Stack
from tests.e2e.test_ray_jobs import TERMINAL, wait_for

pytestmark = pytest.mark.ray

EXAMPLES = REPO / "examples" / "frameworks"


def run(command: list[str], stack: Stack | None = None, timeout: float = 600) -> str:
    env = dict(os.environ)
    if stack is not None:
        env.update({"TRAINMASTER_API_URL": stack.api.url, "TRAINMASTER_TOKEN": stack.api.token})
    for name in ("TRAINMASTER_JOB_ID", "RANK", "WORLD_SIZE", "TF_CONFIG"):
        env.pop(name, None)
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def seen_by_ranks(out: Path, world: int) -> list[dict[str, Any]]:
    records = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == list(range(world)), records
    for record in records:
        assert record["world_size"] == world, record  # the framework's own world size
        assert record["allreduce"] == world * (world + 1) / 2, record  # its own all-reduce of rank+1
    return records


def submitted_id(stdout: str) -> str:
    return next(line.split()[1] for line in stdout.splitlines() if line.startswith("submitted "))


@pytest.mark.parametrize("example", ["tensorflow", "mpi", "paddle", "jax"])
def test_example_runs_alone_then_on_two_workers_unchanged(stack: Stack, tmp_path: Path, example: str) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    run([sys.executable, str(EXAMPLES / example / "train.py"), "--steps", "3", "--out", str(alone)])
    seen_by_ranks(alone, 1)

    out = tmp_path / "two"
    out.mkdir()
    stdout = run([sys.executable, str(EXAMPLES / "submit.py"), example, "--out", str(out)], stack)
    assert "succeeded; last loss:" in stdout and "None" not in stdout
    seen_by_ranks(out, 2)
    with stack.client() as client:
        runtime = [e for e in client.events(submitted_id(stdout)) if e.kind == "runtime"]
    assert runtime and runtime[0].data["framework"] == example and runtime[0].data["world_size"] == 2


def test_jax_function_mode_runs_on_jax_trainer(stack: Stack, tmp_path: Path) -> None:
    with stack.client() as client:
        job = client.submit(
            name="jax-function",
            entrypoint="train:train_loop_per_worker",
            working_dir=EXAMPLES / "jax",
            framework="jax",
            config={"steps": 3, "out": str(tmp_path)},
            scaling=tm.Scaling(num_workers=2),
        )
        done = wait_for(client, job.id, TERMINAL)
        assert done.status is tm.JobStatus.succeeded, done.error
        runtime = [e for e in client.events(job.id) if e.kind == "runtime"]
    seen_by_ranks(tmp_path, 2)
    assert runtime[0].data["backend"].startswith("jax.distributed") and runtime[0].data["world_size"] == 2
