"""Domain errors: each carries its HTTP status and renders as {"error": "<Class>", "detail": ...}."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.responses import JSONResponse


class DomainError(Exception):
    status_code = 400

    def __init__(self, detail: Any = None, *, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.detail = detail
        self.headers = headers

    @property
    def name(self) -> str:
        return type(self).__name__


class Unauthorized(DomainError):
    status_code = 401

    def __init__(self, detail: Any = "missing or invalid bearer token"):
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(DomainError):
    """A valid token whose scope does not allow this (a project token on an admin route, a metrics token
    anywhere but /metrics)."""

    status_code = 403


class NotFound(DomainError):
    status_code = 404

    @classmethod
    def unless_uuid(cls, raw: str, noun: str) -> uuid.UUID:
        """`raw` as the id it names, or this 404: a malformed id names nothing."""
        try:
            return uuid.UUID(raw)
        except ValueError:
            raise cls(f"no {noun} {raw!r}") from None


class JobNotFound(NotFound):
    pass


class Conflict(DomainError):
    """The name is taken (a cluster, a project)."""

    status_code = 409


class IllegalTransition(DomainError):
    status_code = 409


class PayloadTooLarge(DomainError):
    status_code = 413


class UnsupportedMediaType(DomainError):
    status_code = 415


class ValidationError(DomainError):
    """422 naming the field: detail is a list of {"loc": [...], "msg": ...}."""

    status_code = 422

    @classmethod
    def field(cls, loc: list[str | int], msg: str) -> ValidationError:
        return cls([{"loc": loc, "msg": msg, "type": "value_error"}])


class IdempotencyKeyReused(ValidationError):
    pass


class TooManyStreams(DomainError):
    status_code = 429


class LimitExceeded(DomainError):
    """429: a write past one of the limits on what a job or a project writes (api/limits/). The detail
    names the limit, its value and the setting that raises it; a rate's refusal says when to retry."""

    status_code = 429

    def __init__(self, what: str, value: float, setting: str, *, retry_after_s: float | None = None):
        detail = limit_detail(what, value, setting)
        headers = None
        if retry_after_s is not None:
            detail += f"; retry after {retry_after_s:.1f} s"
            headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
        super().__init__(detail, headers=headers)


def limit_detail(what: str, value: float, setting: str) -> str:
    """A limit as its refusal names it: `metric points per job per second: 20000
    (TRAINMASTER_METRIC_POINTS_PER_JOB_PER_S)`."""
    shown = int(value) if float(value).is_integer() else value
    return f"{what}: {shown} ({setting})"


class DatabaseUnavailable(DomainError):
    status_code = 503

    def __init__(self, detail: Any = "the database is unreachable; retry shortly"):
        super().__init__(detail, headers={"Retry-After": "1"})


class SubmitInDoubt(DatabaseUnavailable):
    """PostgreSQL went away while a new job's INSERT was in flight: it may have committed before the
    connection broke, and nobody can tell until the database is back. The answer names the job."""

    def __init__(self, job_id: str):
        super().__init__(
            f"the database went away while job {job_id} was being stored, so it may exist: resubmit with the "
            f"same Idempotency-Key (one job whatever happened) or GET /v1/jobs/{job_id} once the database is back"
        )
        self.headers = {**(self.headers or {}), "Location": f"/v1/jobs/{job_id}"}


def error_responses(*codes: int) -> dict[int | str, dict[str, object]]:
    """OpenAPI entries for the errors a router answers with, all shaped {"error", "detail"}."""
    from trainmaster.models import ErrorBody

    described = {
        400: "Malformed request",
        401: "Missing or invalid bearer token",
        403: "The token's scope does not allow this",
        404: "No such job in the caller's project",
        409: "Illegal status transition, or the name is taken",
        413: "Body over the size limit",
        415: "Wrong content type",
        422: "Invalid field (detail names it)",
        429: "Over a limit: too many open streams, or a write past a job's or a project's limit (detail names it)",
        503: "Database unavailable; retry",
        507: "Over the project's storage quota (detail says how much is stored and what to do)",
    }
    # Errors are JSON even on routes whose success is a stream of server-sent events.
    return {
        code: {"model": ErrorBody, "description": described[code], "content": {"application/json": {}}}
        for code in codes
    }


def error_response(
    status_code: int, name: str, detail: object, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": name, "detail": detail}, status_code=status_code, headers=dict(headers or {}))


def domain_error_response(exc: DomainError) -> JSONResponse:
    return error_response(exc.status_code, exc.name, exc.detail, exc.headers)


def request_invalid_response(exc: RequestValidationError) -> JSONResponse:
    """A 422 for a request FastAPI (or a decoder holding to its rules) found invalid: each error's field
    path (`loc`), message and type."""
    detail = [
        {"loc": list(err.get("loc", [])), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
    return error_response(422, "ValidationError", detail)
