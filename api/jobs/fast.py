"""The fast lane: `GET /v1/jobs/{id}`, `POST /v1/jobs` and `POST /v1/jobs/{id}/metrics` without FastAPI's
routing and dependencies.

These are what clients call most: every submission, every status poll, every metric batch. Through FastAPI a job read
walked the route list and solved five dependencies, and that was about half of the API's own CPU for it
(the profile is in bench/README.md). This ASGI middleware, inside the request-metrics and body-limit
middleware, answers them with the same service functions, the same authentication and the same error
bodies. What it does not answer goes on to the FastAPI routes in api/jobs/routes.py, which stay the
documented contract: other paths and methods, a body that is not JSON, not an object or not a valid spec
(FastAPI's own 415 and 422 naming the field, so those errors have one source). A metric batch is
decoded by api/metrics/batch.py on both ways in, and its 422 is rendered by the same function.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError as SpecInvalid
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth.deps import current_project, not_metrics
from api.auth.principal import Principal
from api.auth.service import authenticate
from api.db.unavailable import DATABASE_DOWN, database_unavailable
from api.errors import DomainError, domain_error_response, request_invalid_response
from api.jobs import service
from api.limits.service import limits_of
from api.metrics.service import ingest
from api.wire import json_response
from trainmaster.models import JobSpec

_ONE_JOB = re.compile(r"^/v1/jobs/([^/]+)$")
_METRICS = re.compile(r"^/v1/jobs/([^/]+)/metrics$")


@dataclass(frozen=True)
class _Route:
    """What the request-metrics middleware reads of the matched route (scope["route"]): its template;
    and whether a job token may call it (it writes its own job's metrics, no more)."""

    path: str
    job_tokens: bool = False


READ_ROUTE = _Route("/v1/jobs/{job_id}")
SUBMIT_ROUTE = _Route("/v1/jobs")
INGEST_ROUTE = _Route("/v1/jobs/{job_id}/metrics", job_tokens=True)


class FastLane:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path, headers = scope["method"], scope["path"], Headers(scope=scope)
            if method == "GET" and (match := _ONE_JOB.match(path)):
                await self._answer(scope, receive, send, headers, READ_ROUTE, self._read, match.group(1))
                return
            if method == "POST" and (match := _METRICS.match(path)) and _is_json(headers):
                body = await _read_body(receive)
                await self._answer(scope, receive, send, headers, INGEST_ROUTE, self._ingest, (match.group(1), body))
                return
            if method == "POST" and path == "/v1/jobs" and _is_json(headers):
                body = await _read_body(receive)
                spec = _parse_spec(body)
                if spec is not None:
                    await self._answer(scope, receive, send, headers, SUBMIT_ROUTE, self._submit, spec)
                    return
                receive = _replay(body, receive)  # FastAPI says what is wrong with it
        await self.app(scope, receive, send)

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, route: _Route, handler: Any, arg: Any
    ) -> None:
        scope["route"] = route
        scope["tm.arrived"] = asyncio.get_running_loop().time()  # the rank cache is trusted from here on
        try:
            principal = await self._principal(scope, headers)
            if not route.job_tokens:
                principal = await current_project(principal)
            response = await handler(scope, headers, principal, arg)
        except DomainError as exc:
            response = domain_error_response(exc)
        except RequestValidationError as exc:
            response = request_invalid_response(exc)
        except DATABASE_DOWN as exc:
            response = database_unavailable(exc)
        await response(scope, receive, send)

    async def _principal(self, scope: Scope, headers: Headers) -> Principal:
        state = scope["app"].state
        principal = await authenticate(state.direct, headers.get("authorization"), getattr(state, "tokens", None))
        return not_metrics(principal)

    async def _read(self, scope: Scope, _headers: Headers, principal: Principal, job_id: str) -> Response:
        state = scope["app"].state
        return json_response(await service.read(state.direct, principal, job_id, state.ranks, scope["tm.arrived"]))

    async def _submit(self, scope: Scope, headers: Headers, principal: Principal, spec: JobSpec) -> Response:
        key = headers.get("idempotency-key")
        job, created = await service.submit(scope["app"].state.direct, principal, spec, key)
        answer = {"Location": f"/v1/jobs/{job.id}"}
        if not created:
            answer["Idempotent-Replayed"] = "true"
        return json_response(job.wire, 201, answer)

    async def _ingest(self, scope: Scope, _headers: Headers, principal: Principal, arg: tuple[str, bytes]) -> Response:
        job_id, body = arg
        state = scope["app"].state
        ack = await ingest(state.direct, limits_of(state), principal, job_id, body)
        return json_response(ack, 201)


def _is_json(headers: Headers) -> bool:
    content_type = headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "application/json"


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away; the answer will go nowhere
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


def _parse_spec(body: bytes) -> JobSpec | None:
    """The spec, parsed as FastAPI would (json.loads, then the model); None when FastAPI must refuse it."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
        return None
    if not isinstance(document, dict):
        return None
    try:
        return JobSpec.model_validate(document)
    except (SpecInvalid, RecursionError):
        return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
