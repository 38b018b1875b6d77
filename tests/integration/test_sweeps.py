"""Sweeps on a real PostgreSQL: the API in process, the controller driven round by round, metric points
posted through the API as a trial's training code would post them. No Ray: the controller never asks it."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.db.session import create_engine, session_factory
from api.jobs import service as jobs_service
from api.settings import Settings
from api.settings import libpq_url as libpq
from api.sweeps import controller
from tests.factories.http import bearer
from tests.factories.sweeps import sweep_body


class Controller:
    """A controller process: its own engine, as the dispatcher has. A new one stands for a restart."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def round(self) -> int:
        async def once() -> int:
            engine = create_engine(self.settings)
            try:
                return await controller.sweep_round(session_factory(engine))
            finally:
                await engine.dispose()

        return asyncio.run(once())


@pytest.fixture
def control(settings: Settings) -> Controller:
    return Controller(settings)


def create(http: TestClient, auth: dict[str, str], **overrides: Any) -> dict[str, Any]:
    response = http.post("/v1/sweeps", json=sweep_body(**overrides), headers=auth)
    assert response.status_code == 201, response.text
    return dict(response.json())


def get(http: TestClient, auth: dict[str, str], sweep_id: str) -> dict[str, Any]:
    response = http.get(f"/v1/sweeps/{sweep_id}", headers=auth)
    assert response.status_code == 200, response.text
    return dict(response.json())


def trial(sweep: dict[str, Any], n: int) -> dict[str, Any]:
    return next(t for t in sweep["trials"] if t["n"] == n)


def log(http: TestClient, auth: dict[str, str], job_id: str, *steps: tuple[int, float], name: str = "loss") -> None:
    body = {"points": [{"step": step, "values": {name: value}} for step, value in steps]}
    content = json.dumps(body)  # NaN and Infinity as JavaScript writes them, which the API keeps
    headers = {**auth, "Content-Type": "application/json"}
    response = http.post(f"/v1/jobs/{job_id}/metrics", content=content, headers=headers)
    assert response.status_code in (200, 201, 202), response.text


def set_status(database_url: str, job_id: str, status: str) -> None:
    """What the dispatcher does to a trial's job (start it, see it end), in one statement."""
    finished = "now()" if status in ("succeeded", "failed", "cancelled", "timed_out") else "NULL"
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute(f"UPDATE jobs SET status = %s, finished_at = {finished} WHERE id = %s", (status, job_id))


def sweep_jobs(database_url: str, sweep_id: str) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    with psycopg.connect(libpq(database_url)) as conn:
        rows = conn.execute(
            "SELECT id::text, status::text, spec, labels FROM jobs WHERE labels @> %s::jsonb ORDER BY created_at",
            (f'{{"sweep": "{sweep_id}"}}',),
        ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


# -- creating, sampling, the grid ------------------------------------------------------------------


def test_grid_sweep_queues_its_first_trials_as_labelled_jobs_with_config_updated(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    sweep = create(http, auth, max_concurrent=2)
    assert sweep["status"] == "running" and sweep["max_trials"] == 4 and sweep["max_concurrent"] == 2
    assert [t["params"] for t in sorted(sweep["trials"], key=lambda t: t["n"])] == [
        {"hidden": 32, "dropout": 0.0},
        {"hidden": 32, "dropout": 0.5},
    ]
    jobs = sweep_jobs(database_url, sweep["id"])
    assert len(jobs) == 2 and {status for _, status, _, _ in jobs} == {"queued"}
    for job_id, _, spec, labels in jobs:
        n = int(labels["trial"])
        assert labels["sweep"] == sweep["id"] and trial(sweep, n)["job_id"] == job_id
        assert spec["config"] == {"steps": 10, "step_s": 0.0, **trial(sweep, n)["params"]}
        assert spec["entrypoint"] == "builtin:toy-curve"
    listed = http.get("/v1/jobs", params={"label": f"sweep:{sweep['id']}"}, headers=auth).json()["items"]
    assert len(listed) == 2


def test_controller_keeps_max_concurrent_running_until_max_trials_then_completes_with_the_best(
    http: TestClient, auth: dict[str, str], database_url: str, control: Controller
) -> None:
    sweep = create(http, auth, max_concurrent=2)
    control.round()
    assert len(get(http, auth, sweep["id"])["trials"]) == 2  # nothing ended: nothing new
    finals = {0: 0.9, 1: 0.4, 2: 0.7, 3: 0.6}
    for n in range(4):
        current = get(http, auth, sweep["id"])
        job_id = trial(current, n)["job_id"]
        set_status(database_url, job_id, "running")
        log(http, auth, job_id, (5, finals[n] + 1), (10, finals[n]))
        set_status(database_url, job_id, "succeeded")
        control.round()
        assert len(get(http, auth, sweep["id"])["trials"]) == min(4, n + 3)
    done = get(http, auth, sweep["id"])
    assert done["status"] == "completed" and done["finished_at"] is not None
    assert [t["n"] for t in done["trials"]] == [1, 3, 2, 0]  # ranked by the metric, best first
    assert done["best"]["n"] == 1 and done["best"]["metric"] == 0.4 and done["best"]["step"] == 10
    assert done["best"]["params"] == {"hidden": 32, "dropout": 0.5}
    assert done["trial_counts"] == {"succeeded": 4}
    assert len(sweep_jobs(database_url, sweep["id"])) == 4


def test_a_trial_made_after_the_projects_max_priority_was_lowered_is_refused_and_the_sweep_says_why(
    http: TestClient, auth: dict[str, str], database_url: str, control: Controller
) -> None:
    spec = {"name": "toy", "entrypoint": "builtin:toy-curve", "config": {"steps": 10, "step_s": 0.0}, "priority": 50}
    sweep = create(http, auth, max_concurrent=1, spec=spec)
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:  # an admin's PATCH, as its statement
        conn.execute(
            "UPDATE projects SET max_priority = 10 WHERE id = (SELECT project_id FROM sweeps WHERE id = %s)",
            (sweep["id"],),
        )
    set_status(database_url, trial(sweep, 0)["job_id"], "succeeded")
    control.round()
    failed = get(http, auth, sweep["id"])
    assert failed["status"] == "failed" and "at most 10, the max_priority of project" in (failed["error"] or "")
    assert len(sweep_jobs(database_url, sweep["id"])) == 1  # no trial above the limit was queued


def test_sampled_parameters_stay_in_their_ranges_and_a_seed_repeats_them(
    http: TestClient, auth: dict[str, str]
) -> None:
    parameters = {
        "lr": {"log_uniform": [1e-4, 1e-1]},
        "hidden": {"values": [32, 64]},
        "dropout": {"uniform": [0, 0.5]},
    }
    first = create(http, auth, parameters=parameters, max_trials=6, seed=7)
    again = create(http, auth, parameters=parameters, max_trials=6, seed=7)
    params = [t["params"] for t in sorted(first["trials"], key=lambda t: t["n"])]
    assert params == [t["params"] for t in sorted(again["trials"], key=lambda t: t["n"])]
    assert len(params) == 6 and len({p["lr"] for p in params}) == 6
    for p in params:
        assert 1e-4 <= p["lr"] <= 1e-1 and p["hidden"] in (32, 64) and 0 <= p["dropout"] <= 0.5
    assert sum(p["lr"] < 1e-2 for p in params) >= 2  # log-uniform: two of three decades lie below 1e-2


# -- early stopping --------------------------------------------------------------------------------


def asha(http: TestClient, auth: dict[str, str], **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "parameters": {"hidden": {"values": [16, 32, 64, 128, 256]}},
        "max_concurrent": 3,
        "early_stopping": {"policy": "asha", "grace_steps": 2, "reduction_factor": 3},
    }
    return create(http, auth, **(body | overrides))


def test_asha_stops_a_trial_outside_the_best_third_at_a_rung_naming_rule_and_step(
    http: TestClient, auth: dict[str, str], database_url: str, control: Controller
) -> None:
    sweep = asha(http, auth)
    jobs = {n: trial(sweep, n)["job_id"] for n in range(3)}
    for job_id in jobs.values():
        set_status(database_url, job_id, "running")
    log(http, auth, jobs[1], (1, 0.9), (2, 0.5))
    control.round()  # alone at rung 2: nobody to compare with, it continues
    log(http, auth, jobs[0], (1, 1.1), (2, 0.8), (3, 0.7))
    log(http, auth, jobs[2], (1, 0.7), (2, 0.45))
    control.round()
    current = get(http, auth, sweep["id"])
    stopped = trial(current, 0)
    assert stopped["status"] == "stopped"
    assert stopped["stopped_reason"].startswith("asha: at step 2 loss 0.8 ")
    assert "1/3" in stopped["stopped_reason"]
    assert trial(current, 1)["status"] == "running" and trial(current, 2)["status"] == "running"
    job = http.get(f"/v1/jobs/{jobs[0]}", headers=auth).json()
    assert job["status"] == "cancelling"  # the normal cancel path: the dispatcher stops it in Ray
    events = http.get(f"/v1/jobs/{jobs[0]}/events", headers=auth).json()["items"]
    assert any(e["kind"] == "early_stopped" and e["message"] == stopped["stopped_reason"] for e in events)
    assert len(current["trials"]) == 3  # a cancelling trial still holds its slot

    set_status(database_url, jobs[0], "cancelled")
    control.round()
    current = get(http, auth, sweep["id"])
    assert len(current["trials"]) == 4 and trial(current, 0)["status"] == "stopped"


def test_asha_judges_again_at_the_next_rung(
    http: TestClient, auth: dict[str, str], database_url: str, control: Controller
) -> None:
    sweep = asha(http, auth)
    jobs = {n: trial(sweep, n)["job_id"] for n in range(3)}
    log(http, auth, jobs[0], (2, 0.5), (6, 0.3))
    control.round()
    log(http, auth, jobs[1], (2, 0.4), (6, 0.35))  # fine at rung 2 (best), outside the best third at 6
    control.round()
    reason = trial(get(http, auth, sweep["id"]), 1)["stopped_reason"]
    assert reason is not None and reason.startswith("asha: at step 6 loss 0.35")


def test_median_rule_stops_a_trial_worse_than_the_median_of_the_others_at_its_step(
    http: TestClient, auth: dict[str, str], database_url: str, control: Controller
) -> None:
    sweep = create(
        http,
        auth,
        parameters={"hidden": {"values": [16, 32, 64, 128]}},
        mode="max",
        metric="accuracy",
        early_stopping={"policy": "median", "grace_steps": 5},
    )
    jobs = {n: trial(sweep, n)["job_id"] for n in range(4)}
    log(http, auth, jobs[0], (5, 0.6), name="accuracy")
    log(http, auth, jobs[1], (5, 0.7), name="accuracy")
    control.round()  # fewer than two others at step 5: nobody is judged
    log(http, auth, jobs[2], (4, 0.9), (5, 0.5), name="accuracy")
    log(http, auth, jobs[3], (5, 0.69), name="accuracy")
    control.round()
    current = get(http, auth, sweep["id"])
    assert trial(current, 2)["stopped_reason"] == (
        "median: at step 5 accuracy 0.5 is worse than the median 0.69 of the 3 other trials there"
    )
    assert trial(current, 3)["stopped_reason"] is None  # 0.69 beats the median 0.6 of 0.6, 0.7 and 0.5
    assert current["best"]["n"] == 1


def test_a_diverged_metric_stops_the_trial_at_its_rung(
    http: TestClient, auth: dict[str, str], database_url: str, control: Controller
) -> None:
    sweep = asha(http, auth)
    job_id = trial(sweep, 0)["job_id"]
    log(http, auth, job_id, (2, math.inf))
    control.round()
    assert trial(get(http, auth, sweep["id"]), 0)["stopped_reason"] == "asha: at step 2 loss is not a finite number"


# -- durability ------------------------------------------------------------------------------------


def test_a_controller_restart_keeps_what_was_read_and_decides_from_it(
    http: TestClient, auth: dict[str, str], database_url: str, settings: Settings
) -> None:
    sweep = asha(http, auth)
    jobs = {n: trial(sweep, n)["job_id"] for n in range(3)}
    log(http, auth, jobs[1], (2, 0.5))
    Controller(settings).round()
    # A new controller (another process, after a restart) knows trial 1's rung value from the database.
    log(http, auth, jobs[0], (2, 0.8))
    Controller(settings).round()
    assert trial(get(http, auth, sweep["id"]), 0)["stopped_reason"] is not None
    Controller(settings).round()
    events = http.get(f"/v1/jobs/{jobs[0]}/events", headers=auth).json()["items"]
    assert sum(e["kind"] == "early_stopped" for e in events) == 1  # points already read are not judged twice


def test_a_round_that_dies_midway_leaves_nothing_and_the_next_launches_each_trial_once(
    http: TestClient, auth: dict[str, str], database_url: str, control: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = create(http, auth, max_concurrent=1)
    set_status(database_url, trial(sweep, 0)["job_id"], "succeeded")
    real_submit = jobs_service.submit

    async def submit_then_die(*args: Any, **kwargs: Any) -> Any:
        await real_submit(*args, **kwargs)
        raise ConnectionError("the controller's process died here")

    monkeypatch.setattr(jobs_service, "submit", submit_then_die)
    assert control.round() == 0
    assert len(sweep_jobs(database_url, sweep["id"])) == 1  # the job of trial 1 rolled back with the round
    monkeypatch.setattr(jobs_service, "submit", real_submit)
    assert control.round() == 1
    jobs = sweep_jobs(database_url, sweep["id"])
    assert sorted(labels["trial"] for _, _, _, labels in jobs) == ["0", "1"]


def test_concurrent_controllers_never_launch_a_trial_twice(
    http: TestClient, auth: dict[str, str], database_url: str, settings: Settings
) -> None:
    sweep = create(http, auth, parameters={"hidden": {"values": list(range(1, 13))}}, max_concurrent=3)

    async def race() -> None:
        engines = [create_engine(settings) for _ in range(3)]
        try:
            await asyncio.gather(*(controller.sweep_round(session_factory(e)) for e in engines))
        finally:
            for engine in engines:
                await engine.dispose()

    for _ in range(6):
        for job_id, status, _, _ in sweep_jobs(database_url, sweep["id"]):
            if status == "queued":
                set_status(database_url, job_id, "succeeded")
        asyncio.run(race())
    jobs = sweep_jobs(database_url, sweep["id"])
    trials = [labels["trial"] for _, _, _, labels in jobs]
    assert len(trials) == len(set(trials)) == len(get(http, auth, sweep["id"])["trials"])
    assert sum(status == "queued" for _, status, _, _ in jobs) <= 3


# -- cancel, list, errors --------------------------------------------------------------------------


def test_cancel_ends_the_sweep_and_its_unfinished_trials_and_nothing_new_starts(
    http: TestClient, auth: dict[str, str], database_url: str, control: Controller
) -> None:
    sweep = create(http, auth, max_concurrent=3)
    jobs = {n: trial(sweep, n)["job_id"] for n in range(3)}
    set_status(database_url, jobs[0], "succeeded")
    set_status(database_url, jobs[1], "running")
    response = http.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth)
    assert response.status_code == 202 and response.json()["status"] == "cancelled"
    statuses = {labels["trial"]: status for _, status, _, labels in sweep_jobs(database_url, sweep["id"])}
    assert statuses == {"0": "succeeded", "1": "cancelling", "2": "cancelled"}
    control.round()
    assert len(sweep_jobs(database_url, sweep["id"])) == 3
    assert http.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth).status_code == 409


def test_list_shows_the_projects_sweeps_newest_first_with_counts(
    http: TestClient, auth: dict[str, str], other_token: str
) -> None:
    older = create(http, auth, name="older")
    newer = create(http, auth, name="newer", max_concurrent=1)
    create(http, bearer(other_token), name="theirs")
    items = http.get("/v1/sweeps", headers=auth).json()["items"]
    assert [s["id"] for s in items] == [newer["id"], older["id"]]
    assert items[0]["trial_counts"] == {"queued": 1} and items[0]["trials"] == []
    assert http.get("/v1/sweeps", params={"status": "completed"}, headers=auth).json()["items"] == []


def test_another_projects_sweep_answers_404(http: TestClient, auth: dict[str, str], other_token: str) -> None:
    sweep = create(http, auth)
    theirs = bearer(other_token)
    for response in (
        http.get(f"/v1/sweeps/{sweep['id']}", headers=theirs),
        http.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=theirs),
        http.get("/v1/sweeps/not-a-uuid", headers=auth),
    ):
        assert response.status_code == 404 and response.json()["error"] == "SweepNotFound"


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"parameters": {"lr": {"log_uniform": [0, 1]}}, "max_trials": 3}, ["body", "parameters", "lr"]),
        ({"parameters": {"lr": {"uniform": [1, 1]}}, "max_trials": 3}, ["body", "parameters", "lr"]),
        ({"parameters": {"lr": {"values": [1], "uniform": [0, 1]}}}, ["body", "parameters", "lr"]),
        ({"parameters": {"lr": {"choice": [1, 2]}}}, ["body", "parameters", "lr", "choice"]),
        ({"parameters": {}}, ["body", "parameters"]),
        ({"parameters": {"lr": {"uniform": [0, 1]}}}, ["body", "max_trials"]),
        ({"max_trials": 5}, ["body", "max_trials"]),
        ({"max_concurrent": 0}, ["body", "max_concurrent"]),
        ({"mode": "lowest"}, ["body", "mode"]),
        ({"early_stopping": {"policy": "hyperband"}}, ["body", "early_stopping", "policy"]),
        ({"early_stopping": {"policy": "asha", "reduction_factor": 1}}, ["body", "early_stopping", "reduction_factor"]),
        ({"metric": ""}, ["body", "metric"]),
        ({"spec": {"name": "x", "entrypoint": "builtin:toy-curve", "scaling": {"num_workers": 0}}}, ["body", "spec"]),
        ({"spec": {"name": "x", "entrypoint": "builtin:toy-curve", "code": "sha256:" + "0" * 64}}, ["body", "spec"]),
        ({"max_trial": 3}, ["body", "max_trial"]),
    ],
)
def test_bad_sweeps_get_422_naming_the_field_and_create_nothing(
    http: TestClient, auth: dict[str, str], database_url: str, overrides: dict[str, Any], loc: list[str]
) -> None:
    response = http.post("/v1/sweeps", json=sweep_body(**overrides), headers=auth)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "ValidationError" and body["detail"][0]["loc"][: len(loc)] == loc, body
    with psycopg.connect(libpq(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM sweeps").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


# -- the SDK ---------------------------------------------------------------------------------------


@pytest.fixture
def sdk_client(http: TestClient, token: str) -> Iterator[Any]:
    import trainmaster as tm

    with tm.Client("http://testserver", token, transport=http._transport) as client:
        yield client


def test_sdk_sweep_get_list_and_cancel(sdk_client: Any, database_url: str, control: Controller) -> None:
    import trainmaster as tm

    sweep = sdk_client.sweep(
        name="sdk-sweep",
        spec=tm.JobSpec(name="toy", entrypoint="builtin:toy-curve", config={"steps": 4}),
        parameters={"lr": {"log_uniform": [1e-4, 1e-1]}, "hidden": {"values": [32, 64]}},
        max_trials=3,
        max_concurrent=2,
        metric="loss",
        early_stopping={"policy": "asha", "grace_steps": 2},
        seed=3,
    )
    assert sweep.status.value == "running" and len(sweep.trials) == 2
    assert {t.job_id for t in sweep.trials} <= {job.id for job in sdk_client.list(labels={"sweep": sweep.id})}
    assert sdk_client.get_sweep(sweep.id).info.id == sweep.id
    assert [s.id for s in sdk_client.sweeps()] == [sweep.id]
    with pytest.raises(tm.WaitTimeout):
        sweep.wait(timeout=0.2, poll_interval=0.05)
    assert sweep.cancel().status.value == "cancelled"
    with pytest.raises(tm.NotFound):
        sdk_client.get_sweep("00000000-0000-0000-0000-000000000000")
