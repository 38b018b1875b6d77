"""The checkpoint lifecycle (api/dispatcher/checkpoint_collector.py) on real PostgreSQL and a real storage folder:
a job keeps its latest `num_to_keep`, its best by `keep_best` and every pinned checkpoint; a finished
job's checkpoints expire after its project's retention unless pinned; what is deleted goes from the disk
and is marked in the API, so that the files on disk are exactly the ones the API lists as kept. A path
a job reported outside its own folder is never removed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

import trainmaster as tm
from api.db.session import create_engine, session_factory
from api.dispatcher.checkpoint_collector import Collected
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.auth import scoped_token
from tests.factories.checkpoints import run_collector
from tests.factories.database import project_id
from tests.factories.http import bearer
from tests.factories.jobs import spec


def add_checkpoints(database_url: str, storage: Path, job_id: str, metrics: list[dict[str, Any]]) -> list[int]:
    """Checkpoints as Ray Train writes them (`<storage>/<job id>/checkpoint_<n>/`) and the job's
    callback records them (one row each, oldest first)."""
    ids = []
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        for step, values in enumerate(metrics):
            folder = storage / job_id / f"checkpoint_{step:06d}"
            folder.mkdir(parents=True)
            (folder / "model.pt").write_bytes(b"weights" * 10)
            row = conn.execute(
                "INSERT INTO checkpoints (job_id, attempt, path, step, metrics)"
                " VALUES (%s, 1, %s, %s, %s) RETURNING id",
                (job_id, str(folder), step, json.dumps(values)),
            ).fetchone()
            assert row is not None
            ids.append(int(row[0]))
    return ids


def on_disk(storage: Path, job_id: str) -> set[str]:
    return {str(path) for path in (storage / job_id).iterdir()} if (storage / job_id).exists() else set()


def kept(sdk: tm.Client, job_id: str) -> set[str]:
    return {item.path for item in sdk.checkpoints(job_id) if item.deleted_at is None}


def test_the_latest_the_best_and_the_pinned_are_kept_and_the_disk_agrees_with_the_api(
    sdk: tm.Client, http: TestClient, other_token: str, database_url: str, tmp_path: Path
) -> None:
    storage = tmp_path / "storage"
    job = sdk.submit(tm.JobSpec.model_validate(spec(checkpoint={"num_to_keep": 2, "keep_best": {"metric": "acc"}})))
    accs: list[Any] = [0.1, 0.9, 0.3, "high", 0.2, 0.4, 0.5]  # a metric that is not a number is never the best
    ids = add_checkpoints(database_url, storage, job.id, [{"acc": acc} for acc in accs])
    sdk.pin_checkpoint(job.id, ids[0])

    done = run_collector(database_url, storage)
    assert (done.marked, done.deleted) == (3, 3)
    listed = {item.id: item for item in sdk.checkpoints(job.id)}
    assert {i for i, item in listed.items() if item.deleted_at is None} == {ids[0], ids[1], ids[5], ids[6]}
    assert listed[ids[2]].deleted_why == "not among the job's latest 2 nor its best by keep_best"
    assert on_disk(storage, job.id) == kept(sdk, job.id)
    assert run_collector(database_url, storage) == Collected()  # nothing more is due

    # A deleted checkpoint cannot be pinned (409); one the job does not have is 404, as is another
    # project's job; nothing changes.
    assert http.post(f"/v1/jobs/{job.id}/checkpoints/{ids[2]}/pin", headers=sdk._http.headers).status_code == 409
    assert http.post(f"/v1/jobs/{job.id}/checkpoints/999999/pin", headers=sdk._http.headers).status_code == 404
    other = bearer(other_token)
    assert http.post(f"/v1/jobs/{job.id}/checkpoints/{ids[5]}/pin", headers=other).status_code == 404
    assert http.post(f"/v1/jobs/{job.id}/checkpoints/0/pin", headers=sdk._http.headers).status_code == 422
    assert not any(item.pinned for item in sdk.checkpoints(job.id) if item.id != ids[0])

    # Unpinned, the oldest is neither latest nor best: the next pass deletes it.
    assert sdk.pin_checkpoint(job.id, ids[0], pinned=False).pinned is False
    assert run_collector(database_url, storage).deleted == 1
    assert (
        on_disk(storage, job.id)
        == kept(sdk, job.id)
        == {str(storage / job.id / f"checkpoint_{n:06d}") for n in (1, 5, 6)}
    )


def test_keep_best_in_min_mode_keeps_the_lowest(sdk: tm.Client, database_url: str, tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    policy = {"num_to_keep": 1, "keep_best": {"metric": "loss", "mode": "min"}}
    job = sdk.submit(tm.JobSpec.model_validate(spec(checkpoint=policy)))
    ids = add_checkpoints(database_url, storage, job.id, [{"loss": loss} for loss in (0.5, 0.2, 0.7, 0.9)])
    run_collector(database_url, storage)
    assert {item.id for item in sdk.checkpoints(job.id) if item.deleted_at is None} == {ids[1], ids[3]}
    assert on_disk(storage, job.id) == kept(sdk, job.id)


def test_a_finished_jobs_checkpoints_expire_after_its_projects_retention_unless_pinned(
    sdk: tm.Client, http: TestClient, database_url: str, tmp_path: Path
) -> None:
    storage = tmp_path / "storage"
    admin = bearer(scoped_token(database_url, "alpha"))
    finished, running = (sdk.submit(tm.JobSpec.model_validate(spec(name=name))) for name in ("finished", "running"))
    old = add_checkpoints(database_url, storage, finished.id, [{}, {}, {}])
    live = add_checkpoints(database_url, storage, running.id, [{}])
    sdk.pin_checkpoint(finished.id, old[1])
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:  # it finished three days ago
        conn.execute(
            "UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '3 days' WHERE id = %s",
            (finished.id,),
        )
    assert run_collector(database_url, storage) == Collected()  # no retention set: kept forever

    answer = http.patch("/v1/projects/alpha", json={"checkpoint_retention_days": -1}, headers=admin)
    assert answer.status_code == 422 and "checkpoint_retention_days" in answer.text
    answer = http.patch("/v1/projects/alpha", json={"checkpoint_retention_days": 2}, headers=admin)
    assert answer.status_code == 200 and answer.json()["checkpoint_retention_days"] == 2
    assert run_collector(database_url, storage).deleted == 2
    listed = {item.id: item for item in sdk.checkpoints(finished.id)}
    assert [i for i in old if listed[i].deleted_at is None] == [old[1]]  # the pinned one
    assert listed[old[0]].deleted_why == "the project keeps checkpoints 2 days after the job finished"
    assert on_disk(storage, finished.id) == kept(sdk, finished.id)
    assert [item.id for item in sdk.checkpoints(running.id) if item.deleted_at is None] == live

    cleared = http.patch("/v1/projects/alpha", json={"checkpoint_retention_days": None}, headers=admin)
    assert cleared.status_code == 200 and cleared.json()["checkpoint_retention_days"] is None


def test_a_path_outside_the_jobs_own_folder_is_marked_but_never_removed(
    sdk: tm.Client, database_url: str, tmp_path: Path
) -> None:
    """A job's code is hostile: what it reports as a checkpoint path may name another job's folder,
    the storage root, or a link out of its own folder. None of those is removed."""
    storage = tmp_path / "storage"
    job, neighbour = (sdk.submit(tm.JobSpec.model_validate(spec(name=n, checkpoint={"num_to_keep": 1}))) for n in "ab")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    neighbours = add_checkpoints(database_url, storage, neighbour.id, [{}])
    (storage / job.id).mkdir(parents=True)
    (storage / job.id / "link").symlink_to(victim)
    hostile = [
        str(victim),
        str(storage / neighbour.id),
        str(storage),
        str(storage / job.id / "link"),
        str(storage / job.id),
    ]
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        for step, path in enumerate(hostile):
            conn.execute("INSERT INTO checkpoints (job_id, path, step) VALUES (%s, %s, %s)", (job.id, path, step))
    add_checkpoints(database_url, storage, job.id, [{}])  # the latest, kept

    done = run_collector(database_url, storage)
    assert (done.marked, done.deleted) == (len(hostile), 0)
    assert (victim / "precious").read_text() == "keep me"
    assert (
        kept(sdk, neighbour.id) == on_disk(storage, neighbour.id) == {str(storage / neighbour.id / "checkpoint_000000")}
    )
    assert [item.id for item in sdk.checkpoints(neighbour.id)] == neighbours
    whys = [item.deleted_why or "" for item in sdk.checkpoints(job.id) if item.deleted_at is not None]
    assert len(whys) == len(hostile) and all("outside the job's storage folder" in why for why in whys), whys


def test_remote_storage_is_left_to_ray(sdk: tm.Client, database_url: str, tmp_path: Path) -> None:
    job = sdk.submit(tm.JobSpec.model_validate(spec(checkpoint={"num_to_keep": 1})))
    add_checkpoints(database_url, tmp_path, job.id, [{}, {}])
    assert run_collector(database_url, "s3://bucket/runs") == Collected()
    assert len(kept(sdk, job.id)) == 2


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"keep_best": {"metric": "acc", "mode": "best"}}, "mode"),
        ({"keep_best": {"metric": ""}}, "metric"),
        ({"keep_best": {"mode": "max"}}, "metric"),
        ({"num_to_keep": 0}, "num_to_keep"),
    ],
)
def test_a_bad_checkpoint_policy_is_422_naming_the_field(
    http: TestClient, auth: dict[str, str], database_url: str, policy: dict[str, Any], field: str
) -> None:
    answer = http.post("/v1/jobs", json=spec(checkpoint=policy), headers=auth)
    assert answer.status_code == 422
    assert any(field in error["loc"] for error in answer.json()["detail"]), answer.text
    with psycopg.connect(libpq(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_storage_not_mounted_on_the_dispatchers_host_is_not_collected(
    sdk: tm.Client, database_url: str, tmp_path: Path
) -> None:
    """Every checkpoint would look gone: none is marked, and the files on the nodes stay listed."""
    job = sdk.submit(tm.JobSpec.model_validate(spec(checkpoint={"num_to_keep": 1})))
    add_checkpoints(database_url, tmp_path / "storage", job.id, [{}, {}])
    assert run_collector(database_url, tmp_path / "not-mounted") == Collected()
    assert len(kept(sdk, job.id)) == 2


def test_a_checkpoint_pinned_after_the_pass_read_it_is_not_deleted(
    sdk: tm.Client, database_url: str, tmp_path: Path
) -> None:
    """The pass reads what is due, then locks it: the lock checks the row again, so a pin written in
    between wins."""
    from api.dispatcher.checkpoint_collector import DUE, LOCK

    storage = tmp_path / "storage"
    job = sdk.submit(tm.JobSpec.model_validate(spec(checkpoint={"num_to_keep": 1})))
    ids = add_checkpoints(database_url, storage, job.id, [{}, {}])
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        due = [row[0] for row in conn.execute(DUE.text.replace(":limit", "10"))]
        assert due == [ids[0]]
        sdk.pin_checkpoint(job.id, ids[0])
        assert conn.execute(LOCK.text.replace(":ids", "%s"), ([ids[0]],)).fetchall() == []


def test_the_dispatchers_collector_task_passes_at_once_and_stops_when_told(
    sdk: tm.Client, database_url: str, tmp_path: Path
) -> None:
    from api.dispatcher.checkpoint_collector import collect_every

    storage = tmp_path / "storage"
    job = sdk.submit(tm.JobSpec.model_validate(spec(checkpoint={"num_to_keep": 1})))
    add_checkpoints(database_url, storage, job.id, [{}, {}])

    async def go() -> None:
        engine = create_engine(Settings(database_url=database_url))
        sessions, stopping = session_factory(engine), asyncio.Event()
        try:
            await asyncio.wait_for(collect_every(sessions, str(storage), 0, stopping), 5)  # 0: never collects
            assert len(kept(sdk, job.id)) == 2
            task = asyncio.create_task(collect_every(sessions, str(storage), 3600, stopping))
            deadline = asyncio.get_running_loop().time() + 30
            while len(await asyncio.to_thread(kept, sdk, job.id)) != 1:  # the first pass, at once
                assert asyncio.get_running_loop().time() < deadline, "no pass within 30 s"
                await asyncio.sleep(0.05)
            stopping.set()
            await asyncio.wait_for(task, 5)  # not an hour
        finally:
            await engine.dispose()

    asyncio.run(go())
    assert on_disk(storage, job.id) == kept(sdk, job.id)


def test_runs_are_laid_out_per_project_and_another_projects_folder_is_never_removed(
    sdk: tm.Client, http: TestClient, other_token: str, database_url: str, tmp_path: Path
) -> None:
    """A job is given `<storage>/<project id>` (launch.build), so its run is `<storage>/<project>/<job>/`:
    the collector removes what is due there; a path the job reports inside another project's folder
    is marked and left, whatever it names."""
    storage = tmp_path / "storage"
    job = sdk.submit(tm.JobSpec.model_validate(spec(checkpoint={"num_to_keep": 1})))
    with tm.Client("http://testserver", other_token, transport=http._transport) as other_sdk:
        theirs = other_sdk.submit(tm.JobSpec.model_validate(spec(name="theirs")))
    own_folder, their_folder = storage / project_id(database_url, job.id), storage / project_id(database_url, theirs.id)
    assert own_folder != their_folder
    add_checkpoints(database_url, their_folder, theirs.id, [{}])
    their_files = on_disk(their_folder, theirs.id)
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:  # reported by the hostile job
        conn.execute(
            "INSERT INTO checkpoints (job_id, path, step) VALUES (%s, %s, -1)", (job.id, str(their_folder / theirs.id))
        )
    ids = add_checkpoints(database_url, own_folder, job.id, [{}, {}])

    done = run_collector(database_url, storage)
    assert (done.marked, done.deleted) == (2, 1)
    assert on_disk(own_folder, job.id) == kept(sdk, job.id) == {str(own_folder / job.id / "checkpoint_000001")}
    assert on_disk(their_folder, theirs.id) == their_files  # untouched
    assert [c.id for c in sdk.checkpoints(job.id) if c.deleted_at is None] == [ids[1]]
