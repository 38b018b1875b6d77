"""What a job's processes know about their job, and the one way they talk back to the API.

The dispatcher builds the environment of every attempt with `JobContext.to_env`; the driver, the
Ray Train controller callback, every worker and `trainmaster.log()` read it back with
`JobContext.from_env`. The variable names are defined here and nowhere else.

A launch carries its job token's single-use claim, never the token: every job on a Ray cluster can read
every launch through Ray's Jobs API. The claim travels in the Ray job's metadata (CLAIM_METADATA_KEY),
never in its runtime environment: Ray writes a runtime environment's variables into the command line of
every worker process it starts for the job (its job supervisor first), and any local user can read a
command line (/proc/<pid>/cmdline). Ray's job supervisor hands the metadata to the driver alone, in its
environment (RAY_JOB_CONFIG_JSON_ENV_VAR). The driver exchanges the claim once (`JobContext.claimed`),
and keeps the token in its own environment; the Ray Train controller and workers get it from the driver
inside Ray (workers/callbacks.py: JobTokenCallback).

`JobApi` is the job's one HTTP client (job token, timeouts on): events, checkpoints and metric
batches. Reporting must never fail a training run, so its callers swallow and print errors.
Metric batches, sent several times a second from inside the training process, go on a kept-alive
`http.client` connection of their own (`MetricsPoster`): about 0.7 ms of the process's CPU per
request, against 1.9 ms through httpx (bench/README.md, "What trainmaster.log costs the step").
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

ENV_JOB_ID = "TRAINMASTER_JOB_ID"
ENV_ATTEMPT = "TRAINMASTER_ATTEMPT"
ENV_JOB_SPEC = "TRAINMASTER_JOB_SPEC"
ENV_API_URL = "TRAINMASTER_API_URL"
ENV_JOB_TOKEN = "TRAINMASTER_JOB_TOKEN"
CLAIM_METADATA_KEY = "trainmaster_claim"  # in the Ray job's metadata (Launch.metadata)
# Set by Ray's job supervisor in its driver's environment: the job's runtime_env and metadata, as JSON.
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
ENV_STORAGE_PATH = "TRAINMASTER_STORAGE_PATH"
ENV_LABEL_SELECTOR = "TRAINMASTER_LABEL_SELECTOR"  # JSON: the node labels the gang's workers must carry
ENV_ELASTIC_RESIZE_S = "TRAINMASTER_ELASTIC_RESIZE_S"  # how often an elastic gang considers growing
ENV_COLLECTIVE_TIMEOUT_S = "TRAINMASTER_COLLECTIVE_TIMEOUT_S"
ENV_SYSTEM_METRICS_INTERVAL_S = "TRAINMASTER_SYSTEM_METRICS_INTERVAL_S"
# A Ray Train worker's world rank, for frameworks whose own environment names none (TensorFlow, JAX)
ENV_WORKER_RANK = "TRAINMASTER_WORKER_RANK"

DEFAULT_STORAGE_PATH = "~/.trainmaster/storage"
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0
DEFAULT_SYSTEM_METRICS_INTERVAL_S = 5.0


def project_storage(storage: str, project_id: str) -> str:
    """The project's own folder of the storage (`<storage>/<project id>`, a URI's too): what a job of the
    project is given as its storage path, so its runs land in `<storage>/<project id>/<job id>/`."""
    if "://" in storage:
        return f"{storage.rstrip('/')}/{project_id}"
    return str(Path(storage) / project_id)


def run_folders(project_id: str, job_id: str) -> tuple[tuple[str, ...], ...]:
    """Where a job's run folder is below the storage root, each way it may be laid out: per project
    (`project_storage`), or `<storage>/<job id>` as runs were written before (migration 0022's release)."""
    return (project_id, job_id), (job_id,)


def launch_claim(env: Mapping[str, str]) -> str | None:
    """The claim the launch's metadata carries, as Ray's job supervisor gave it to the driver."""
    try:
        claim = json.loads(env.get(RAY_JOB_CONFIG) or "{}").get("metadata", {}).get(CLAIM_METADATA_KEY)
    except (ValueError, AttributeError):
        return None
    return claim if isinstance(claim, str) and claim else None


def _forget_claim() -> None:
    """Drop the spent claim from this process's Ray job config, so `ray.init` records none."""
    try:
        config = json.loads(os.environ.get(RAY_JOB_CONFIG) or "{}")
        config.get("metadata", {}).pop(CLAIM_METADATA_KEY, None)
    except (ValueError, AttributeError):
        return
    os.environ[RAY_JOB_CONFIG] = json.dumps(config)


def _float(raw: str | None, default: float) -> float:
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


@dataclass(frozen=True)
class JobContext:
    job_id: str
    attempt: int = 1
    api_url: str | None = None
    token: str | None = None
    claim: str | None = None
    spec_json: str | None = None
    storage_path: str = DEFAULT_STORAGE_PATH
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    system_metrics_interval_s: float = DEFAULT_SYSTEM_METRICS_INTERVAL_S
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobContext | None:
        """The job this process belongs to, or None outside a trainmaster job."""
        env = os.environ if environ is None else environ
        job_id = env.get(ENV_JOB_ID)
        if not job_id:
            return None
        return cls(
            job_id=job_id,
            attempt=int(_float(env.get(ENV_ATTEMPT), 1)),
            api_url=env.get(ENV_API_URL) or None,
            token=env.get(ENV_JOB_TOKEN) or None,
            claim=launch_claim(env),
            spec_json=env.get(ENV_JOB_SPEC),
            storage_path=env.get(ENV_STORAGE_PATH) or DEFAULT_STORAGE_PATH,
            collective_timeout_s=_float(env.get(ENV_COLLECTIVE_TIMEOUT_S), DEFAULT_COLLECTIVE_TIMEOUT_S),
            system_metrics_interval_s=_float(env.get(ENV_SYSTEM_METRICS_INTERVAL_S), DEFAULT_SYSTEM_METRICS_INTERVAL_S),
        )

    def to_env(self) -> dict[str, str]:
        """The environment of the attempt's processes; `extra_env` (the job's own) cannot override ours,
        except the collective timeout, which a job may set for itself. Never the claim: Ray shows a
        runtime environment's variables on command lines (`launch_metadata` carries it)."""
        env = {
            ENV_COLLECTIVE_TIMEOUT_S: str(self.collective_timeout_s),
            **{name: value for name, value in self.extra_env.items() if name != ENV_JOB_TOKEN},
            ENV_JOB_ID: self.job_id,
            ENV_ATTEMPT: str(self.attempt),
            ENV_STORAGE_PATH: self.storage_path,
            ENV_SYSTEM_METRICS_INTERVAL_S: str(self.system_metrics_interval_s),
        }
        for name, value in (
            (ENV_API_URL, self.api_url),
            (ENV_JOB_TOKEN, self.token),
            (ENV_JOB_SPEC, self.spec_json),
        ):
            if value:
                env[name] = value
        return env

    def launch_metadata(self) -> dict[str, str]:
        """What of this context the launch carries in its Ray job's metadata: the claim."""
        return {CLAIM_METADATA_KEY: self.claim} if self.claim else {}

    def claimed(self, *, tries: int = 7, transport: httpx.BaseTransport | None = None) -> JobContext:
        """This context with its job token in place of the claim, exchanged with the API once, and the
        token set in this process's environment (for `from_env` and its children), the claim dropped
        from its Ray job config. Unchanged when it holds no claim. A refused claim raises ClaimRefused;
        an API that does not answer, or answers that it cannot now (5xx, 429: its database restarting),
        is asked `tries` times, a second apart and doubling to 15 s (about 45 s in all)."""
        if not (self.claim and self.api_url):
            return self
        url = f"{self.api_url.rstrip('/')}/v1/tokens/claim"
        delay = 1.0
        with httpx.Client(timeout=10, transport=transport) as http:
            for attempt in range(tries):
                try:
                    response = http.post(url, json={"job_id": self.job_id, "claim": self.claim})
                    if (response.status_code < 500 and response.status_code != 429) or attempt == tries - 1:
                        break
                except httpx.TransportError:
                    if attempt == tries - 1:
                        raise
                time.sleep(delay)
                delay = min(delay * 2, 15.0)
        if response.status_code != 201:
            refusal = f"{response.status_code}: {response.text[:300]}"
            raise ClaimRefused(f"the API refused this job's token claim ({refusal})")
        token = response.json()["token"]
        os.environ[ENV_JOB_TOKEN] = token
        _forget_claim()
        return replace(self, token=token, claim=None)

    @property
    def can_report(self) -> bool:
        return bool(self.api_url and self.token)

    def api(self, *, transport: httpx.BaseTransport | None = None) -> JobApi:
        if not (self.api_url and self.token):
            raise RuntimeError(f"job {self.job_id} has no API address or token to report with")
        return JobApi(self.api_url, self.token, self.job_id, self.attempt, transport=transport)


class ClaimRefused(RuntimeError):
    """The API would not exchange the job's claim: used already, expired, or not this job's."""


class JobApi:
    """The job's HTTP client: one connection pool, the job token, a timeout on every call."""

    def __init__(
        self,
        api_url: str,
        token: str,
        job_id: str,
        attempt: int | None,
        *,
        transport: httpx.BaseTransport | None = None,
    ):
        self.job_url = f"{api_url.rstrip('/')}/v1/jobs/{job_id}"
        self.attempt = attempt
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10, transport=transport)
        # A scripted transport (tests) answers the metric batches too; otherwise their own connection.
        self.metrics = None if transport is not None else MetricsPoster(f"{self.job_url}/metrics", token)

    def post_event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> httpx.Response:
        body = {"kind": kind, "message": message, "data": {"attempt": self.attempt, **(data or {})}}
        return self.http.post(f"{self.job_url}/events", json=body)

    def record_checkpoint(
        self, path: str, step: int | None, metrics: dict[str, float], size_bytes: int | None = None
    ) -> httpx.Response:
        return self.http.post(
            f"{self.job_url}/checkpoints",
            params={"attempt": self.attempt} if self.attempt else None,
            json={"path": path, "step": step, "metrics": metrics, "size_bytes": size_bytes},
        )

    def post_metrics(self, batch: dict[str, Any]) -> tuple[int, bytes]:
        """The answer's status code and body; raises OSError or http.client.HTTPException (or
        httpx.HTTPError through a scripted transport) when no answer came."""
        if self.metrics is None:
            response = self.http.post(f"{self.job_url}/metrics", json=batch)
            return response.status_code, response.content
        return self.metrics.post(json.dumps(batch, separators=(",", ":")).encode())

    def control(self) -> httpx.Response:
        return self.http.get(f"{self.job_url}/control")

    def close(self) -> None:
        self.http.close()
        if self.metrics is not None:
            self.metrics.close()


class MetricsPoster:
    """POSTs of JSON bodies to one URL on one kept-alive connection (reopened when it breaks)."""

    def __init__(self, url: str, token: str, timeout_s: float = 10.0):
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port
        self.path = parts.path
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.connection: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> tuple[int, bytes]:
        """The answer's status code and body."""
        try:
            return self._post(body)
        except (OSError, http.client.HTTPException):
            return self._post(body)  # a kept-alive connection the server closed meanwhile: once more on a new one

    def _post(self, body: bytes) -> tuple[int, bytes]:
        connection = self.connection or self._connect()
        try:
            connection.request("POST", self.path, body, self.headers)
            response = connection.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, answer

    def _connect(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        self.connection = kind(self.host, self.port, timeout=self.timeout_s)
        return self.connection

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _best_effort(
    what: str, call: Callable[[JobApi], httpx.Response], *, answers: tuple[int, ...] = ()
) -> httpx.Response | None:
    """Run one report with a fresh client: its answer when it succeeded or is one of `answers`; None
    (and a printed line) outside a job or on error."""
    context = JobContext.from_env()
    if context is None or not context.can_report:
        return None
    api = context.api()
    try:
        response = call(api)
        if response.status_code not in answers:
            response.raise_for_status()
        return response
    except httpx.HTTPError as exc:
        print(f"[trainmaster] could not record {what}: {exc}", file=sys.stderr, flush=True)
        return None
    finally:
        api.close()


def post_event(kind: str, message: str, data: dict[str, Any] | None = None) -> bool:
    """A best-effort job event from any process of the job; printed instead outside a job."""
    if _best_effort(f"event {kind!r}", lambda api: api.post_event(kind, message, data)) is not None:
        return True
    print(f"[trainmaster] {kind}: {message} {data or ''}", flush=True)
    return False


STORAGE_QUOTA_EXCEEDED = 507


def record_checkpoint(
    path: str, step: int | None, metrics: dict[str, float], size_bytes: int | None = None
) -> str | None:
    """Tell the API about a checkpoint Ray Train registered; best effort like every report. The API's
    refusal when the checkpoint would take the project over its storage quota (it is recorded as
    deleted, and its files are the caller's to remove), else None."""
    response = _best_effort(
        f"checkpoint {path}",
        lambda api: api.record_checkpoint(path, step, metrics, size_bytes),
        answers=(STORAGE_QUOTA_EXCEEDED,),
    )
    if response is None or response.status_code != STORAGE_QUOTA_EXCEEDED:
        return None
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError):
        return response.text or "over the project's storage quota"
