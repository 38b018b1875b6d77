"""Best-effort job events from inside Ray (driver and workers) to the API, with the job token.

Reporting must never fail a training run: errors are printed and swallowed.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx

from workers.runtime import JobContext


def post_event(kind: str, message: str, data: dict[str, Any] | None = None) -> bool:
    context = JobContext.from_env()
    if context is None or not context.api_url or not context.token:
        print(f"[trainmaster] {kind}: {message} {data or ''}", flush=True)
        return False
    try:
        response = httpx.post(
            f"{context.api_url}/v1/jobs/{context.job_id}/events",
            json={"kind": kind, "message": message, "data": {"attempt": context.attempt, **(data or {})}},
            headers={"Authorization": f"Bearer {context.token}"},
            timeout=10,
        )
        response.raise_for_status()
        return True
    except httpx.HTTPError as exc:
        print(f"[trainmaster] could not record event {kind!r}: {exc}", file=sys.stderr, flush=True)
        return False
