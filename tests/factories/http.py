"""Requests to the API as a client makes them: the Authorization header, and the calls many tests make
through the in-process app (FastAPI's TestClient, an httpx.Client) or a real server."""

from __future__ import annotations

from typing import Any

import httpx

from tests.factories.jobs import spec


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submit(http: httpx.Client, token: str, **overrides: Any) -> str:
    """A job of `spec(**overrides)`, its id; fails unless it was created."""
    response = http.post("/v1/jobs", json=spec(**overrides), headers=bearer(token))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def post_losses(
    http: httpx.Client, token: str, job_id: str, losses: list[float], *, first_step: int = 0, attempt: int | None = None
) -> None:
    """Rank 0's `loss`, one point per step from `first_step`; fails unless they were stored."""
    points = [{"step": first_step + i, "values": {"loss": loss}, "rank": 0} for i, loss in enumerate(losses)]
    body: dict[str, object] = {"points": points} if attempt is None else {"points": points, "attempt": attempt}
    response = http.post(f"/v1/jobs/{job_id}/metrics", json=body, headers=bearer(token))
    assert response.status_code in (200, 201, 202), response.text


def falling_losses(first_step: int, count: int) -> list[float]:
    """A loss curve that falls, 1 / (step + 1), from `first_step`: for `post_losses`."""
    return [1.0 / (step + 1) for step in range(first_step, first_step + count)]


def storage_rows(http: httpx.Client, token: str) -> dict[str, dict[str, Any]]:
    """GET /v1/storage as `token` sees it, by project."""
    answer = http.get("/v1/storage", headers=bearer(token))
    assert answer.status_code == 200, answer.text
    return {row["project"]: row for row in answer.json()["items"]}
