"""A job cannot make the checkpoint collector delete a file of the operator's by planting links.

The job owns its run folder and may replace it, its project's folder or any folder inside it with a
link to a folder of the operator's, then report checkpoints under it so the collector deletes one.
Through the real collector (api/dispatcher/checkpoint_collector.py `collect`, as root, on a real PostgreSQL with
jobs made through the API): the operator's files survive, the rows say why, the job gets an event; and
where the project's folder belongs to a cluster's OS user, the removal runs as that user, not as root
(a file only root may delete in the run survives). Real users and files: run as root (as CI runs the
suite)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

import trainmaster as tm
from api.app import create_app
from api.settings import Settings
from api.settings import libpq_url as libpq
from api.stack import osusers
from tests.factories.auth import project_token
from tests.factories.checkpoints import run_collector
from tests.factories.database import project_id
from tests.factories.jobs import spec

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the collector must run as root, as it did when this happened"
)


@pytest.fixture
def database_url(fresh_database_url: str) -> str:
    return fresh_database_url


@pytest.fixture
def sdk(database_url: str) -> Iterator[tm.Client]:
    settings = Settings(database_url=database_url, code_retention_days=None)
    with (
        TestClient(create_app(settings), raise_server_exceptions=False) as http,
        tm.Client("http://testserver", project_token(database_url, "alpha"), transport=http._transport) as client,
    ):
        yield client


@pytest.fixture
def operator(tmp_path: Path) -> Path:
    """The operator's folder, outside storage, holding what a hostile job's reported paths will name."""
    folder = tmp_path / "operator"
    folder.mkdir()
    (folder / "precious").write_text("the operator's")
    return folder


def reported(database_url: str, job_id: str, *paths: Path) -> list[int]:
    """Checkpoint rows as the job's callback records them, oldest first."""
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        return [
            int(conn.execute(  # type: ignore[index]
                "INSERT INTO checkpoints (job_id, path, step) VALUES (%s, %s, %s) RETURNING id", (job_id, str(p), n)
            ).fetchone()[0])
            for n, p in enumerate(paths)
        ]  # fmt: skip


def submit(sdk: tm.Client) -> tm.JobHandle:
    return sdk.submit(tm.JobSpec.model_validate(spec(checkpoint={"num_to_keep": 1})))


def deleted_whys(sdk: tm.Client, job_id: str) -> list[str]:
    return [c.deleted_why or "" for c in sdk.checkpoints(job_id) if c.deleted_at is not None]


def test_a_linked_run_folder_project_folder_or_inner_folder_deletes_nothing_of_the_operators(
    sdk: tm.Client, database_url: str, tmp_path: Path, operator: Path
) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    run_linked, project_linked, inner_linked, old_layout = (submit(sdk) for _ in range(4))
    project = project_id(database_url, run_linked.id)
    # the project's folder itself a link: everything below it is the operator's
    other = tmp_path / "other-project"
    (other / project_linked.id).mkdir(parents=True)
    (other / project_linked.id / "precious").write_text("the operator's")
    # (checked first, on its own: the project's folder is shared by the project's jobs)
    (storage / project).symlink_to(other)
    reported(database_url, project_linked.id, storage / project / project_linked.id / "precious", storage / "x")
    done = run_collector(database_url, storage)
    assert (done.marked, done.deleted) == (1, 0)
    assert (other / project_linked.id / "precious").read_text() == "the operator's"
    assert deleted_whys(sdk, project_linked.id) == [
        f"not among the job's latest 1; its path leads outside the job's storage folder through a link ({project}),"
        " so no file was removed"
    ]
    (storage / project).unlink()

    (storage / project).mkdir()
    (storage / project / run_linked.id).symlink_to(operator)  # the run folder, as in the report
    reported(database_url, run_linked.id, *(storage / project / run_linked.id / n for n in ("precious", "later")))
    (storage / project / inner_linked.id).mkdir()
    (storage / project / inner_linked.id / "sub").symlink_to(operator)
    inner = storage / project / inner_linked.id / "sub"
    reported(database_url, inner_linked.id, inner / "precious", inner / "later")
    (storage / old_layout.id).symlink_to(operator)  # runs written before storage was per project
    reported(database_url, old_layout.id, *(storage / old_layout.id / n for n in ("precious", "later")))

    done = run_collector(database_url, storage)
    assert (done.marked, done.deleted) == (3, 0)
    assert (operator / "precious").read_text() == "the operator's"
    for job, link in (
        (run_linked, f"{project}/{run_linked.id}"),
        (inner_linked, f"{project}/{inner_linked.id}/sub"),
        (old_layout, old_layout.id),
    ):
        (why,) = deleted_whys(sdk, job.id)
        assert f"leads outside the job's storage folder through a link ({link}), so no file was removed" in why
        events = [e for e in sdk.events(job.id) if e.kind == "checkpoint_not_removed"]
        assert len(events) == 1 and events[0].data["component"] == link, events
        assert "is a link" in (events[0].message or "")


@pytest.fixture
def cluster_user() -> osusers.OsUser:
    user = osusers.cluster_user("test-links")  # tm-test-links, as `trainmaster up` makes a cluster's
    assert user is not None
    return user


def test_the_removal_runs_as_the_project_folders_owner_not_as_root(
    sdk: tm.Client, database_url: str, tmp_path: Path, cluster_user: osusers.OsUser
) -> None:
    """The project's folder belongs to the cluster's user (its jobs made it): a checkpoint of that user's
    is removed; one holding a folder only root (user or group) may empty is not (its row stays live for a
    later pass), which root, or the user in the folder's group, would have removed."""
    storage = tmp_path / "storage"
    job = submit(sdk)
    run = storage / project_id(database_url, job.id) / job.id
    for name in ("checkpoint_0", "checkpoint_1", "checkpoint_2"):
        (run / name / "shard").mkdir(parents=True)
        (run / name / "shard" / "model.pt").write_bytes(b"w" * 100)
    for path in (run.parent, *run.parent.rglob("*")):  # chowned by root, left in root's group
        os.chown(path, cluster_user.uid, 0, follow_symlinks=False)
    rooted = run / "checkpoint_1" / "rooted"
    rooted.mkdir()
    rooted.chmod(0o775)  # root's group may write it: the removal must not run in the folder's group
    (rooted / "root-only").write_text("only root may delete this")
    ids = reported(database_url, job.id, *(run / f"checkpoint_{n}" for n in range(3)))

    done = run_collector(database_url, storage)
    assert (done.marked, done.deleted) == (1, 1)
    assert not (run / "checkpoint_0").exists()
    assert (rooted / "root-only").exists()  # the cluster's user may not delete root's file
    live = {c.id for c in sdk.checkpoints(job.id) if c.deleted_at is None}
    assert live == {ids[1], ids[2]}
