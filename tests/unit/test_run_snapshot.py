"""The driver makes Ray Train's run snapshot agree with the disk (workers/run_snapshot.py): Ray's own
checkpoint manager, loading a snapshot whose checkpoints trainmaster deleted, refuses to start the run;
after `prune` it starts, resuming from the newest checkpoint left."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from ray.train import Checkpoint, CheckpointConfig
from ray.train.v2._internal.exceptions import CheckpointManagerInitializationError
from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager
from ray.train.v2._internal.execution.context import StorageContext
from ray.train.v2._internal.execution.training_report import _TrainingReport

from workers import run_snapshot


def ray_manager(storage: Path) -> CheckpointManager:
    return CheckpointManager(CheckpointConfig(), StorageContext(str(storage), "job"))


def reported_run(storage: Path, count: int) -> list[Path]:
    """A run of Ray Train's own checkpoint manager that reported `count` checkpoints (in an event loop,
    as in Ray's controller: a registration notifies its waiters)."""

    async def run() -> list[Path]:
        manager = ray_manager(storage)
        folders = []
        for step in range(count):
            folder = storage / "job" / f"checkpoint_{step:06d}"
            folder.mkdir(parents=True)
            (folder / "model.pt").write_text(str(step))
            manager.register_checkpoint(_TrainingReport(Checkpoint(str(folder)), {"step": step}, validation=False))
            folders.append(folder)
        await asyncio.sleep(0)
        return folders

    return asyncio.run(run())


def test_a_snapshot_listing_deleted_checkpoints_is_pruned_so_ray_starts(tmp_path: Path) -> None:
    folders = reported_run(tmp_path, 3)
    shutil.rmtree(folders[0])  # what the collector deleted (not among the latest N)
    with pytest.raises(CheckpointManagerInitializationError):
        ray_manager(tmp_path)  # what a retry met before

    assert run_snapshot.prune(tmp_path / "job") == ["checkpoint_000000"]
    resumed = ray_manager(tmp_path)
    assert Path(resumed.latest_checkpoint_result.checkpoint.path) == folders[2]
    assert [Path(r.checkpoint.path) for r in resumed.best_checkpoint_results] == folders[1:]


def test_a_latest_checkpoint_that_is_gone_gives_way_to_the_newest_left(tmp_path: Path) -> None:
    folders = reported_run(tmp_path, 3)
    shutil.rmtree(folders[2])  # e.g. refused over the project's storage quota
    assert run_snapshot.prune(tmp_path / "job") == ["checkpoint_000002"]
    assert Path(ray_manager(tmp_path).latest_checkpoint_result.checkpoint.path) == folders[1]

    for folder in folders[:2]:
        shutil.rmtree(folder)
    run_snapshot.prune(tmp_path / "job")
    assert ray_manager(tmp_path).latest_checkpoint_result is None  # starts from scratch, as with no checkpoint


def test_nothing_to_prune_leaves_the_snapshot_as_ray_wrote_it(tmp_path: Path) -> None:
    assert run_snapshot.prune(tmp_path / "job") == []  # no run yet
    reported_run(tmp_path, 2)
    snapshot = tmp_path / "job" / run_snapshot.SNAPSHOT
    before = snapshot.read_bytes()
    assert run_snapshot.prune(tmp_path / "job") == []
    assert snapshot.read_bytes() == before
    snapshot.write_text("{not json")
    assert run_snapshot.prune(tmp_path / "job") == []  # left for Ray to report
    assert json.loads(before)["checkpoint_report_indices"] == [0, 1]
