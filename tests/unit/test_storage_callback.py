"""The job's side of the storage quota (workers/callbacks.py): the controller's callback measures each
checkpoint Ray Train wrote, sends its size with it, and removes the files of one the API refused, only
inside this job's own storage folder (a job's reported path is not trusted to point there)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainmaster.context import ENV_JOB_ID, ENV_STORAGE_PATH
from workers import callbacks


def checkpoint_folder(root: Path, job_id: str, name: str) -> Path:
    folder = root / job_id / name
    (folder / "shard").mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"w" * 1000)
    (folder / "shard" / "optim.pt").write_bytes(b"o" * 24)
    return folder


def test_a_refused_checkpoint_is_measured_sent_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_JOB_ID, "job-1")
    monkeypatch.setenv(ENV_STORAGE_PATH, str(tmp_path))
    folder = checkpoint_folder(tmp_path, "job-1", "checkpoint_000003")
    (folder / "link").symlink_to(tmp_path)  # a link is not counted, nor followed
    sent: list[tuple[Any, ...]] = []

    def refuse(path: str, step: int | None, metrics: dict[str, float], size: int | None) -> str:
        sent.append((path, step, metrics, size))
        return "project 'alpha' is over its storage quota"

    monkeypatch.setattr(callbacks, "record_checkpoint", refuse)
    callbacks.TrainmasterCallback().after_report(None, [{"step": 3, "loss": 0.5}], SimpleNamespace(path=str(folder)))
    assert sent == [(str(folder), 3, {"step": 3.0, "loss": 0.5}, 1024)]
    assert not folder.exists() and tmp_path.exists()


def test_a_kept_checkpoint_stays_and_a_refused_one_elsewhere_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_JOB_ID, "job-1")
    monkeypatch.setenv(ENV_STORAGE_PATH, str(tmp_path))
    mine = checkpoint_folder(tmp_path, "job-1", "checkpoint_000000")
    monkeypatch.setattr(callbacks, "record_checkpoint", lambda *args: None)
    callbacks.TrainmasterCallback().after_report(None, [{"step": 0}], SimpleNamespace(path=str(mine)))
    assert mine.exists()

    neighbours = checkpoint_folder(tmp_path, "job-2", "checkpoint_000000")
    assert "left in place" in callbacks.remove_refused(neighbours)  # another job's folder
    assert "left in place" in callbacks.remove_refused(tmp_path / "job-1")  # the run's folder itself
    (tmp_path / "job-1" / "sneaky").symlink_to(neighbours)
    assert "left in place" in callbacks.remove_refused(tmp_path / "job-1" / "sneaky")  # resolves elsewhere
    assert neighbours.exists() and mine.exists()
    assert callbacks.folder_bytes(tmp_path / "nowhere") is None  # remote storage: not measured
