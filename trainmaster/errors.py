"""One exception tree for everything the SDK raises."""

from __future__ import annotations

from typing import Any

import httpx


class TrainmasterError(Exception):
    """Base of every error the SDK raises."""


class ConnectionFailed(TrainmasterError):
    """The API could not be reached; check TRAINMASTER_API_URL and that `trainmaster api` runs."""


class ApiError(TrainmasterError):
    """The API answered with an error status. Keeps the response for inspection."""

    status_code: int = 0

    def __init__(self, message: str, *, response: httpx.Response | None = None, detail: Any = None):
        super().__init__(message)
        self.response = response
        self.detail = detail
        if response is not None:
            self.status_code = response.status_code


class BadRequest(ApiError):
    status_code = 400


class Unauthorized(ApiError):
    status_code = 401


class Forbidden(ApiError):
    """The token is valid but may not do this (an admin's route, another project's token, a priority
    above the project's limit)."""

    status_code = 403


class NotFound(ApiError):
    status_code = 404


class JobNotFound(NotFound):
    pass


class Conflict(ApiError):
    status_code = 409


class PayloadTooLarge(ApiError):
    status_code = 413


class UnsupportedMediaType(ApiError):
    status_code = 415


class ValidationFailed(ApiError):
    status_code = 422


class TooManyRequests(ApiError):
    status_code = 429


class ServerError(ApiError):
    status_code = 500


class ServiceUnavailable(ServerError):
    status_code = 503


class AmbiguousJobId(TrainmasterError):
    """An id prefix matches more than one job; `candidates` are the ids it matches (up to a few)."""

    def __init__(self, prefix: str, candidates: list[str]):
        shown = ", ".join(candidates[:5]) + (", …" if len(candidates) > 5 else "")
        super().__init__(f"job id prefix {prefix!r} is ambiguous: it matches {shown}; give more characters")
        self.prefix = prefix
        self.candidates = candidates


class JobFailed(TrainmasterError):
    """A job ended in failed, cancelled or timed_out while being waited for."""

    def __init__(self, job: Any):
        reason = job.error or "no error text recorded"
        super().__init__(f"job {job.id} ({job.name}) ended {job.status.value}: {reason}")
        self.job = job


class WaitTimeout(TrainmasterError):
    """`wait(timeout=...)` ran out before the job ended."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: ValidationFailed,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def error_from_response(response: httpx.Response) -> ApiError:
    """Turn an error response into the matching exception, keeping the server's words."""
    try:
        body = response.json()
    except ValueError:
        body = {"error": "HTTPError", "detail": response.text[:500]}
    name = body.get("error", "HTTPError") if isinstance(body, dict) else "HTTPError"
    detail = body.get("detail") if isinstance(body, dict) else body
    cls: type[ApiError]
    if name == "JobNotFound":
        cls = JobNotFound
    else:
        cls = _BY_STATUS.get(response.status_code, ServerError if response.status_code >= 500 else ApiError)
    return cls(f"{response.status_code} {name}: {_describe(detail)}", response=response, detail=detail)


def _describe(detail: Any) -> str:
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                parts.append(f"{loc}: {item.get('msg')}" if loc else str(item.get("msg")))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)
