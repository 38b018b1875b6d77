"""What every call shares: `Call` (one request and how its answer becomes a model), `Page`, `Stream`,
the `takes` decorator that gives client methods their parameters, and the httpx options."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, Literal, ParamSpec, Protocol, TypeVar

import httpx

from trainmaster.errors import ConnectionFailed, error_from_response
from trainmaster.sse import ServerEvent

T = TypeVar("T")
A = TypeVar("A")
C = TypeVar("C")
R = TypeVar("R")
P = ParamSpec("P")
Backend = Literal["auto", "nccl", "gloo"]

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
USER_AGENT = "trainmaster-sdk/0.1"
SUBMIT_ATTEMPTS = 4
METRICS_PAGE = 10_000
LOGS_PAGE = 10_000
AMBIGUOUS_SHOWN = 5


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None
    answers: Mapping[int, T] | None = None  # error statuses that are answers, not errors (HEAD's 404)
    text: bool = False  # `parse` takes the body as text (CSV), not JSON

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request(
            self.method, self.path, params=self.params, json=self.json, content=self.content, headers=self.headers
        )

    def answer(self, response: httpx.Response) -> T:
        """The response as this call's model; an error status raises its exception (`errors`)."""
        if self.answers and response.status_code in self.answers:
            return self.answers[response.status_code]
        if response.status_code >= 400:
            raise error_from_response(response)
        if self.text:
            return self.parse(response.text)
        return self.parse(response.json() if response.content else None)


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next: Call[Page[T]] | None


class HasSeq(Protocol):
    @property
    def seq(self) -> int: ...


S = TypeVar("S", bound=HasSeq)


def takes(build: Callable[P, A]) -> Callable[[Callable[[C, A], R]], Callable[Concatenate[C, P], R]]:
    """Gives a client method the parameters of `build` (a function of this module) and, unless it has
    its own, its docstring: the method is called with what `build` makes of the caller's arguments.

    So `Client` and `AsyncClient` declare each call's parameters once, here: a wrong keyword is a
    TypeError at the call (and a mypy error) in both, and `help()` shows the parameters by name."""

    def decorate(method: Callable[[C, A], R]) -> Callable[Concatenate[C, P], R]:
        @functools.wraps(method)
        def bound(self: C, /, *args: P.args, **kwargs: P.kwargs) -> R:
            return method(self, build(*args, **kwargs))

        own = inspect.signature(method)
        parameters = [next(iter(own.parameters.values())), *inspect.signature(build).parameters.values()]
        bound.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        bound.__doc__ = method.__doc__ or build.__doc__
        return bound

    return decorate


def http_options(api_url: str, token: str | None, timeout: float | httpx.Timeout) -> dict[str, Any]:
    """What both clients give their httpx client: base URL, headers (the token) and timeout."""
    headers = {"User-Agent": USER_AGENT}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return {"base_url": api_url, "headers": headers, "timeout": timeout}


def unreachable(api_url: str, error: httpx.TransportError) -> ConnectionFailed:
    return ConnectionFailed(
        f"cannot reach the trainmaster API at {api_url} ({error.__class__.__name__}); "
        "is it running? (`trainmaster up` or `trainmaster api`)"
    )


@dataclass(frozen=True)
class Stream(Generic[T]):
    """An event stream to follow (`sse.follow`) and what its `kind` events carry: a list of `items`."""

    path: str
    kind: str
    item: Callable[[Any], T]
    last_event_id: str | None
    retry_for: float | None

    def items(self, event: ServerEvent) -> list[T]:
        return [self.item(data) for data in event.data["items"]] if event.event == self.kind else []
