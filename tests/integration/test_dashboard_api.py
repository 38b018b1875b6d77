"""What the dashboard and the terminal need from the API: the static UI with its CSP, job-id
prefixes, and metric reads for one rank and one step range."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import trainmaster as tm
from tests.factories.http import bearer
from tests.factories.jobs import spec


def new_job(http: TestClient, auth: dict[str, str], **overrides: object) -> str:
    response = http.post("/v1/jobs", json=spec(**overrides), headers=auth)
    assert response.status_code == 201
    return str(response.json()["id"])


def test_root_and_ui_lead_to_the_dashboard_served_with_a_strict_csp(http: TestClient) -> None:
    for path in ("/", "/ui"):
        response = http.get(path, follow_redirects=False)
        assert response.status_code == 307 and response.headers["location"] == "/ui/"
    page = http.get("/ui/")
    assert page.status_code == 200 and '<script type="module" src="/ui/app.js">' in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    module = http.get("/ui/app.js")  # static files need no token: they hold no data
    assert module.status_code == 200 and "javascript" in module.headers["content-type"]
    assert "content-security-policy" not in http.get("/healthz").headers
    assert http.get("/ui/no-such-file.js").status_code == 404


def test_jobs_are_found_by_an_id_prefix_within_the_project(
    http: TestClient, auth: dict[str, str], other_token: str
) -> None:
    mine = [new_job(http, auth, name=f"j{i}") for i in range(3)]
    theirs = new_job(http, bearer(other_token))
    found = http.get("/v1/jobs", params={"id_prefix": mine[1][:8].upper()}, headers=auth).json()["items"]
    assert [job["id"] for job in found] == [mine[1]]
    assert http.get("/v1/jobs", params={"id_prefix": theirs[:8]}, headers=auth).json()["items"] == []
    everything = http.get("/v1/jobs", params={"id_prefix": ""}, headers=auth)
    assert everything.status_code == 422 and everything.json()["detail"][0]["loc"] == ["query", "id_prefix"]
    assert http.get("/v1/jobs", params={"id_prefix": "xyz%"}, headers=auth).status_code == 422


def test_sdk_resolves_unique_prefixes_and_names_ambiguous_ones(
    sdk: tm.Client, http: TestClient, auth: dict[str, str]
) -> None:
    ids = [new_job(http, auth, name=f"j{i}") for i in range(17)]  # 17 ids: two share a first hex digit
    assert sdk.resolve_id(ids[0][:8]) == ids[0]
    assert sdk.resolve_id(ids[0].upper()) == ids[0]
    first_digits = [i[0] for i in ids]
    shared = next(d for d in first_digits if first_digits.count(d) > 1)
    with pytest.raises(tm.AmbiguousJobId) as ambiguous:
        sdk.resolve_id(shared)
    assert ambiguous.value.prefix == shared and len(ambiguous.value.candidates) >= 2
    assert "give more characters" in str(ambiguous.value)
    missing = "0" * 8 if not any(i.startswith("0" * 8) for i in ids) else "f" * 8
    with pytest.raises(tm.JobNotFound):
        sdk.resolve_id(missing)


def test_metrics_read_one_rank_and_one_step_range_downsampled(http: TestClient, auth: dict[str, str]) -> None:
    job_id = new_job(http, auth)
    points = [{"step": s, "values": {"loss": float(s)}, "rank": r} for s in range(1000) for r in (0, 1)]
    assert http.post(f"/v1/jobs/{job_id}/metrics", json={"points": points}, headers=auth).status_code == 201
    url = f"/v1/jobs/{job_id}/metrics"
    window = http.get(url, params={"since_step": 100, "until_step": 199, "rank": 1}, headers=auth).json()["items"]
    assert [(p["step"], p["rank"]) for p in window] == [(s, 1) for s in range(100, 200)]
    coarse = http.get(url, params={"rank": 0, "max_points": 20}, headers=auth).json()["items"]
    fine = http.get(url, params={"rank": 0, "max_points": 20, "since_step": 500, "until_step": 509}, headers=auth)
    assert len(coarse) <= 20 and {p["rank"] for p in coarse} == {0}
    assert [p["step"] for p in fine.json()["items"]] == list(range(500, 510))  # finer: every step of the range
    backwards = http.get(url, params={"since_step": 10, "until_step": 5}, headers=auth)
    assert backwards.status_code == 422 and backwards.json()["detail"][0]["loc"] == ["query", "until_step"]
