"""Every kind of bad submit answers 4xx naming the field and inserts nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.settings import Settings
from tests.factories.jobs import spec
from tests.integration.conftest import count_jobs


def scaled(**scaling: Any) -> dict[str, Any]:
    return spec(scaling={"num_workers": 2, **scaling})


BAD_SPECS: list[tuple[str, dict[str, Any] | str, str]] = [
    ("negative CPU", scaled(resources_per_worker={"CPU": -1}), "resources_per_worker"),
    ("zero CPU", scaled(resources_per_worker={"CPU": 0}), "resources_per_worker"),
    ("negative GPU", scaled(resources_per_worker={"GPU": -0.5}), "resources_per_worker"),
    ("zero memory", scaled(resources_per_worker={"memory": 0}), "resources_per_worker"),
    ("zero workers", scaled(num_workers=0), "num_workers"),
    ("too many workers", scaled(num_workers=1025), "num_workers"),
    ("unknown strategy", scaled(placement_strategy="SCATTER"), "placement_strategy"),
    ("lower-case strategy", scaled(placement_strategy="pack"), "placement_strategy"),
    ("unknown top-level field", {**spec(), "gpus": 4}, "gpus"),
    ("unknown nested field", scaled(num_worker=2), "num_worker"),
    ("unknown checkpoint field", spec(checkpoint={"keep": 2}), "keep"),
    ("config over 64 KiB", spec(config={"blob": "x" * (64 * 1024)}), "config"),
    ("empty name", spec(name=""), "name"),
    ("129-character name", spec(name="n" * 129), "name"),
    ("non-string label value", spec(labels={"team": 3}), "labels"),
    ("bad entrypoint", spec(entrypoint="rm -rf /"), "entrypoint"),
    ("workers as string", scaled(num_workers="2"), "num_workers"),
    ("elastic min above max", scaled(num_workers={"min": 3, "max": 2}), "must be at most max"),
    ("elastic without max", scaled(num_workers={"min": 1}), '"num_workers", "range", "max"'),
    ("elastic max too large", scaled(num_workers={"min": 1, "max": 1025}), '"num_workers", "range", "max"'),
    (
        "elastic with mpi",
        {**scaled(num_workers={"min": 1, "max": 2}), "framework": "mpi", "entrypoint": "script:t.py"},
        "scaling.num_workers: an elastic gang",
    ),
    ("retries out of range", spec(max_retries=11), "max_retries"),
    ("zero timeout", spec(timeout_s=0), "timeout_s"),
    ("nccl without GPU", spec(backend="nccl"), "nccl"),
    ("bad code id", spec(code="sha256:xyz"), "code"),
    ("unknown framework", spec(framework="keras"), "framework"),
    ("built-in with another framework", spec(framework="tensorflow"), "framework"),
    ("mpi with a function", spec(framework="mpi", entrypoint="train:main"), "framework"),
]

NON_FINITE = ["NaN", "Infinity", "-Infinity"]


def post_raw(http: TestClient, auth: dict[str, str], body: str | bytes, content_type: str = "application/json"):
    return http.post("/v1/jobs", content=body, headers={**auth, "Content-Type": content_type})


def assert_names_field(response: Any, field: str) -> None:
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert body["error"] in {"ValidationError", "IdempotencyKeyReused"}, body
    assert field in json.dumps(body["detail"]), body


@pytest.mark.parametrize(("case", "body", "field"), BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_is_422_naming_the_field(
    http: TestClient, auth: dict[str, str], database_url: str, case: str, body: dict[str, Any], field: str
) -> None:
    response = http.post("/v1/jobs", json=body, headers=auth)
    assert response.status_code == 422
    assert_names_field(response, field)
    assert count_jobs(database_url) == 0


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize("where", ["CPU", "timeout_s"])
def test_nan_and_infinite_numbers_are_refused(
    http: TestClient, auth: dict[str, str], database_url: str, literal: str, where: str
) -> None:
    if where == "CPU":
        text = json.dumps(scaled(resources_per_worker={"CPU": 1})).replace('"CPU": 1', f'"CPU": {literal}')
        field = "resources_per_worker"
    else:
        text = json.dumps(spec(timeout_s=5)).replace('"timeout_s": 5', f'"timeout_s": {literal}')
        field = "timeout_s"
    assert literal in text
    response = post_raw(http, auth, text)
    assert response.status_code == 422
    assert_names_field(response, field)
    assert count_jobs(database_url) == 0


def test_malformed_json(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    response = post_raw(http, auth, '{"name": "x", ')
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][0] == "body"
    assert "JSON" in response.json()["detail"][0]["msg"]
    assert count_jobs(database_url) == 0


def test_wrong_content_type(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    response = post_raw(http, auth, json.dumps(spec()), "text/plain")
    assert response.status_code == 415
    assert response.json()["error"] == "UnsupportedMediaType"
    assert "application/json" in response.json()["detail"]
    assert count_jobs(database_url) == 0


def test_body_over_limit_is_413(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    limit = Settings().max_body_bytes
    body = json.dumps(spec(config={"blob": "x" * (limit + 10)}))
    response = post_raw(http, auth, body)
    assert response.status_code == 413
    assert response.json()["error"] == "PayloadTooLarge"
    assert count_jobs(database_url) == 0


def test_body_over_limit_without_content_length_is_413(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    limit = Settings().max_body_bytes

    def chunks():
        yield b'{"name": "x", "config": {"blob": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}}'

    response = http.post("/v1/jobs", content=chunks(), headers={**auth, "Content-Type": "application/json"})
    assert response.status_code == 413
    assert count_jobs(database_url) == 0


@pytest.mark.parametrize("cursor", ["garbage", "e30", "W10", "!!!"])
def test_garbage_cursor_is_422(http: TestClient, auth: dict[str, str], cursor: str) -> None:
    response = http.get("/v1/jobs", params={"cursor": cursor}, headers=auth)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "cursor"]


def test_bad_status_and_label_filters_are_422(http: TestClient, auth: dict[str, str]) -> None:
    assert_names_field(http.get("/v1/jobs", params={"status": "done"}, headers=auth), "status")
    assert_names_field(http.get("/v1/jobs", params={"label": "nocolon"}, headers=auth), "label")
    assert_names_field(http.get("/v1/jobs", params={"limit": 0}, headers=auth), "limit")


def test_idempotency_key_reused_with_different_body(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    headers = {**auth, "Idempotency-Key": "k1"}
    assert http.post("/v1/jobs", json=spec(), headers=headers).status_code == 201
    response = http.post("/v1/jobs", json=spec(priority=5), headers=headers)
    assert response.status_code == 422
    assert_names_field(response, "Idempotency-Key")
    assert count_jobs(database_url) == 1


def test_overlong_idempotency_key(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    response = http.post("/v1/jobs", json=spec(), headers={**auth, "Idempotency-Key": "k" * 300})
    assert_names_field(response, "Idempotency-Key")
    assert count_jobs(database_url) == 0
