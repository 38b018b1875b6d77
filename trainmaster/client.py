"""The Python SDK: `trainmaster.Client` and the `JobHandle` it returns."""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from trainmaster import config as client_config
from trainmaster import sse
from trainmaster.archive import zip_directory
from trainmaster.errors import (
    AmbiguousJobId,
    ConnectionFailed,
    JobFailed,
    JobNotFound,
    TrainmasterError,
    error_from_response,
)
from trainmaster.models import (
    CheckpointInfo,
    CheckpointList,
    ClusterInfo,
    CodeUpload,
    EventList,
    Job,
    JobEvent,
    JobList,
    JobSpec,
    JobStatus,
    LogLine,
    LogList,
    MetricList,
    MetricValue,
    Scaling,
    Sweep,
    SweepList,
    SweepStatus,
)
from trainmaster.polling import poll_until
from trainmaster.retry import delay_before_retry, is_transient
from trainmaster.sweeps import SweepHandle, sweep_request

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
SUBMIT_ATTEMPTS = 4
METRICS_PAGE = 10_000
LOGS_PAGE = 10_000
AMBIGUOUS_SHOWN = 5


class Client:
    """Talks to the trainmaster API.

    Configuration comes from the arguments, then TRAINMASTER_API_URL / TRAINMASTER_TOKEN, then
    ~/.trainmaster/config (written by `trainmaster up`). Pass `transport` to drive an app in process.
    """

    def __init__(
        self,
        api_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ):
        resolved = client_config.resolve(api_url, token)
        self.api_url = resolved.api_url
        headers = {"User-Agent": "trainmaster-sdk/0.1"}
        if resolved.token:
            headers["Authorization"] = f"Bearer {resolved.token}"
        self._http = httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- jobs -------------------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec | None = None,
        *,
        name: str | None = None,
        entrypoint: str | None = None,
        scaling: Scaling | None = None,
        working_dir: str | Path | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> JobHandle:
        """Submit a job; safe to retry: one Idempotency-Key covers every try of this call.

        `working_dir` is zipped and uploaded first; the workers run in it (script mode reads the
        script from it, function mode imports from it).
        """
        if working_dir is not None:
            fields["code"] = self.upload_code(working_dir).id
        if spec is None:
            given = {"name": name, "entrypoint": entrypoint, "scaling": scaling, **fields}
            spec = JobSpec.model_validate({k: v for k, v in given.items() if v is not None})
        key = idempotency_key or str(uuid.uuid4())
        body = spec.model_dump(mode="json", exclude_unset=False)
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                data = self._request("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
                return JobHandle(self, Job.model_validate(data))
            except TrainmasterError as exc:
                if not is_transient(exc) or attempt == SUBMIT_ATTEMPTS - 1:
                    raise
                time.sleep(delay_before_retry(exc, attempt + 1))
        raise AssertionError("unreachable")

    def upload_code(self, working_dir: str | Path) -> CodeUpload:
        """Zip a working directory (skipping .git, virtualenvs and caches) and upload it."""
        content = zip_directory(Path(working_dir))
        data = self._request("POST", "/v1/code", content=content, headers={"Content-Type": "application/zip"})
        return CodeUpload.model_validate(data)

    def resolve_id(self, id_or_prefix: str) -> str:
        """The full id of the one job whose id starts with `id_or_prefix` (as `trainmaster ls` shows
        8 characters, any unambiguous prefix works, as in git and docker).

        Raises JobNotFound when none matches and AmbiguousJobId when several do.
        """
        wanted = id_or_prefix.strip().lower()
        try:
            return str(uuid.UUID(wanted))
        except ValueError:
            pass
        page = JobList.model_validate(
            self._request("GET", "/v1/jobs", params={"id_prefix": wanted, "limit": AMBIGUOUS_SHOWN + 1})
        )
        ids = [job.id for job in page.items]
        if not ids:
            raise JobNotFound(f"404 JobNotFound: no job whose id starts with {id_or_prefix!r}")
        if len(ids) > 1:
            raise AmbiguousJobId(id_or_prefix, ids)
        return ids[0]

    def get(self, job_id: str) -> JobHandle:
        return JobHandle(self, self._job(job_id))

    def list(
        self,
        *,
        status: JobStatus | str | list[JobStatus | str] | None = None,
        labels: dict[str, str] | None = None,
        limit: int | None = None,
        page_size: int = 100,
    ) -> Iterator[Job]:
        """Jobs newest first, following cursors until `limit` jobs or the end."""
        statuses = status if isinstance(status, list) else [status] if status else []
        params: dict[str, Any] = {
            "status": [s.value if isinstance(s, JobStatus) else s for s in statuses],
            "label": [f"{k}:{v}" for k, v in (labels or {}).items()],
            "limit": min(page_size, limit) if limit else page_size,
        }
        returned = 0
        while True:
            page = JobList.model_validate(self._request("GET", "/v1/jobs", params=params))
            for job in page.items:
                yield job
                returned += 1
                if limit is not None and returned >= limit:
                    return
            if not page.next_cursor:
                return
            params["cursor"] = page.next_cursor

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(self._request("POST", f"/v1/jobs/{job_id}/cancel"))

    def events(self, job_id: str) -> builtins.list[JobEvent]:
        return EventList.model_validate(self._request("GET", f"/v1/jobs/{job_id}/events")).items

    def wait(self, job_id: str, *, timeout: float | None = None, poll_interval: float = 1.0) -> Job:
        """Block until the job ends; return it if it succeeded, raise JobFailed otherwise, WaitTimeout
        after `timeout` s. The API being unreachable, 503 or 429 is waited out (honouring Retry-After)
        for as long as the wait lasts; 401, 404 and other refusals raise at once."""
        job = poll_until(
            lambda: self._job(job_id),
            lambda job: job.status.terminal,
            what=f"job {job_id}",
            timeout=timeout,
            poll_interval=poll_interval,
        )
        if job.status is not JobStatus.succeeded:
            raise JobFailed(job)
        return job

    def cluster(self) -> ClusterInfo:
        """Ray nodes with total and free resources, and the queue depth."""
        return ClusterInfo.model_validate(self._request("GET", "/v1/cluster"))

    # -- sweeps -----------------------------------------------------------------------------------

    def sweep(
        self,
        spec: JobSpec | dict[str, Any],
        *,
        parameters: dict[str, Any],
        metric: str,
        mode: str = "min",
        name: str | None = None,
        max_trials: int | None = None,
        max_concurrent: int | None = None,
        early_stopping: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> SweepHandle:
        """Start a hyperparameter sweep: trials are jobs running `spec` with `config` updated by their
        parameters (`{"values": [...]}`, `{"uniform": [lo, hi]}`, `{"log_uniform": [lo, hi]}`; values
        alone make a grid). `early_stopping={"policy": "asha"|"median", "grace_steps", "reduction_factor"}`
        stops losing trials from their logged `metric`."""
        request = sweep_request(
            spec,
            name=name,
            parameters=parameters,
            metric=metric,
            mode=mode,
            max_trials=max_trials,
            max_concurrent=max_concurrent,
            early_stopping=early_stopping,
            seed=seed,
        )
        data = self._request("POST", "/v1/sweeps", json=request.model_dump(mode="json", exclude_none=True))
        return SweepHandle(self, Sweep.model_validate(data))

    def get_sweep(self, sweep_id: str) -> SweepHandle:
        return SweepHandle(self, Sweep.model_validate(self._request("GET", f"/v1/sweeps/{sweep_id}")))

    def sweeps(self, *, status: SweepStatus | str | None = None, limit: int | None = None) -> builtins.list[Sweep]:
        """Sweeps newest first, with trial counts and the best trial (the full trial list: get_sweep)."""
        params: dict[str, Any] = {"status": [status.value if isinstance(status, SweepStatus) else status]}
        if status is None:
            params = {}
        if limit is not None:
            params["limit"] = limit
        return SweepList.model_validate(self._request("GET", "/v1/sweeps", params=params)).items

    def cancel_sweep(self, sweep_id: str) -> Sweep:
        return Sweep.model_validate(self._request("POST", f"/v1/sweeps/{sweep_id}/cancel"))

    # -- metrics, logs, checkpoints -------------------------------------------------------------

    def metrics(
        self,
        job_id: str,
        *,
        names: builtins.list[str] | None = None,
        since_step: int | None = None,
        max_points: int | None = None,
    ) -> builtins.list[MetricValue]:
        """Stored points, oldest first, all in one list (or about `max_points` per metric, downsampled).
        A long job's points can be millions: `iter_metrics` reads them a page at a time instead."""
        if max_points is None:
            return builtins.list(self.iter_metrics(job_id, names=names, since_step=since_step))
        params: dict[str, Any] = {"name": names or [], "max_points": max_points}
        if since_step is not None:
            params["since_step"] = since_step
        return MetricList.model_validate(self._request("GET", f"/v1/jobs/{job_id}/metrics", params=params)).items

    def iter_metrics(
        self,
        job_id: str,
        *,
        names: builtins.list[str] | None = None,
        since_step: int | None = None,
        page_size: int | None = None,
    ) -> Iterator[MetricValue]:
        """Every stored point, oldest first, read `page_size` (default 10,000, at most 100,000) at a
        time as the iteration reaches them: memory holds one page, whatever the job logged."""
        size = page_size or METRICS_PAGE
        params: dict[str, Any] = {"name": names or [], "limit": size}
        if since_step is not None:
            params["since_step"] = since_step
        while True:
            page = MetricList.model_validate(self._request("GET", f"/v1/jobs/{job_id}/metrics", params=params)).items
            yield from page
            if len(page) < size:
                return
            params["after_seq"] = page[-1].seq

    def stream_metrics(
        self, job_id: str, *, after_seq: int | None = None, retry_for: float | None = None
    ) -> Iterator[MetricValue]:
        """Every metric value as it arrives; ends when the job ends. Reconnects by itself through dropped
        connections, 503 and 429 (after Retry-After), resuming after the last value delivered, so none
        comes twice or goes missing; `retry_for` s of outage (default: no limit) raise the last error."""
        path = f"/v1/jobs/{job_id}/metrics/stream"
        resume = str(after_seq) if after_seq else None
        for event in sse.follow(self._http, path, last_event_id=resume, retry_for=retry_for):
            if event.event == "metrics":
                yield from (MetricValue.model_validate(item) for item in event.data["items"])

    def logs(
        self, job_id: str, *, follow: bool = False, page_size: int = LOGS_PAGE, retry_for: float | None = None
    ) -> Iterator[LogLine]:
        """Every stored log line, oldest first, read `page_size` (at most 100,000) at a time as the
        iteration reaches them. With follow=True the lines come from the job's stream instead: stored
        ones, then new ones as they are written until the job ends, reconnecting like `stream_metrics`."""
        path = f"/v1/jobs/{job_id}/logs"
        if follow:
            for event in sse.follow(self._http, f"{path}/stream", retry_for=retry_for):
                if event.event == "logs":
                    yield from (LogLine.model_validate(item) for item in event.data["items"])
            return
        params: dict[str, Any] = {"limit": page_size}
        while True:
            page = LogList.model_validate(self._request("GET", path, params=params)).items
            yield from page
            if len(page) < page_size:
                return
            params["after_seq"] = page[-1].seq

    def checkpoints(self, job_id: str) -> builtins.list[CheckpointInfo]:
        return CheckpointList.model_validate(self._request("GET", f"/v1/jobs/{job_id}/checkpoints")).items

    # -- plumbing ---------------------------------------------------------------------------------

    def _job(self, job_id: str) -> Job:
        return Job.model_validate(self._request("GET", f"/v1/jobs/{job_id}"))

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ConnectionFailed(
                f"cannot reach the trainmaster API at {self.api_url} ({exc.__class__.__name__}); "
                "is it running? (`trainmaster up` or `trainmaster api`)"
            ) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response.json() if response.content else None


class JobHandle:
    """A submitted job: its last known state plus the calls that act on it."""

    def __init__(self, client: Client, job: Job):
        self._client = client
        self.info = job

    def __repr__(self) -> str:
        return f"JobHandle(id={self.id!r}, name={self.info.name!r}, status={self.status.value!r})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def status(self) -> JobStatus:
        return self.info.status

    def refresh(self) -> Job:
        self.info = self._client._job(self.id)
        return self.info

    def wait(self, *, timeout: float | None = None, poll_interval: float = 1.0) -> Job:
        try:
            self.info = self._client.wait(self.id, timeout=timeout, poll_interval=poll_interval)
        except JobFailed as exc:
            self.info = exc.job
            raise
        return self.info

    def cancel(self) -> Job:
        self.info = self._client.cancel(self.id)
        return self.info

    def events(self) -> list[JobEvent]:
        return self._client.events(self.id)

    def metrics(self, **kwargs: Any) -> list[MetricValue]:
        return self._client.metrics(self.id, **kwargs)

    def iter_metrics(self, **kwargs: Any) -> Iterator[MetricValue]:
        return self._client.iter_metrics(self.id, **kwargs)

    def stream_metrics(self, *, after_seq: int | None = None, retry_for: float | None = None) -> Iterator[MetricValue]:
        return self._client.stream_metrics(self.id, after_seq=after_seq, retry_for=retry_for)

    def logs(
        self, *, follow: bool = False, page_size: int = LOGS_PAGE, retry_for: float | None = None
    ) -> Iterator[LogLine]:
        return self._client.logs(self.id, follow=follow, page_size=page_size, retry_for=retry_for)

    def checkpoints(self) -> list[CheckpointInfo]:
        return self._client.checkpoints(self.id)


__all__ = ["Client", "JobHandle", "TrainmasterError"]
