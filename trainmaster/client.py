"""The Python SDK: `trainmaster.Client` and the `JobHandle` it returns (`AsyncClient`, in
`trainmaster.async_client`, is its twin for asyncio). Both build their requests and read their answers
with `trainmaster.calls`; this module only sends them."""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from trainmaster import calls, sse
from trainmaster import config as client_config
from trainmaster.calls import DEFAULT_TIMEOUT, SUBMIT_ATTEMPTS, Call, JobWait, Page, Stream, Submission, takes
from trainmaster.errors import JobFailed, TrainmasterError
from trainmaster.models import (
    CheckpointInfo,
    ClusterInfo,
    CodeUpload,
    Job,
    JobEvent,
    JobStatus,
    LogLine,
    MetricValue,
    Queues,
    Sweep,
)
from trainmaster.polling import poll_until
from trainmaster.retry import Retries
from trainmaster.sweeps import SweepHandle

T = TypeVar("T")


class Client:
    """Talks to the trainmaster API.

    Configuration comes from the arguments, then TRAINMASTER_API_URL / TRAINMASTER_TOKEN, then
    ~/.trainmaster/config (written by `trainmaster up`). Pass `transport` to drive an app in process.
    Use it as a context manager, or call `close()`, to close its connections. For asyncio code,
    `trainmaster.AsyncClient` has the same calls, awaited.

    Each call's parameters and docstring are declared once in `trainmaster.calls` (`@takes`), for
    this client and `AsyncClient` alike.
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
        self._http = httpx.Client(transport=transport, **calls.http_options(self.api_url, resolved.token, timeout))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- jobs -------------------------------------------------------------------------------------

    @takes(calls.submission)
    def submit(self, submission: Submission) -> JobHandle:
        package = submission.code_package()
        code = None if package is None else self._upload(package).id
        return JobHandle(self, self._send_retried(submission.call(code)))

    def upload_code(
        self, working_dir: str | Path, *, include_secrets: bool = False, include_git: bool = False
    ) -> CodeUpload:
        """Zip a working directory as `trainmaster run` does (trainmaster.packing: ignore files apply;
        secrets, `.git`, virtualenvs and caches stay behind unless `include_secrets` / `include_git`)
        and upload it, unless the project holds that package already (packages are content-addressed:
        the same files, the same `id`). Secrets kept back and a large package are warned of
        (`trainmaster.packing.PackageWarning`)."""
        return self._upload(calls.code_package(working_dir, include_secrets=include_secrets, include_git=include_git))

    def _upload(self, package: calls.CodePackage) -> CodeUpload:
        return package.as_stored() if self._send(package.stored()) else self._send(package.upload())

    def resolve_id(self, id_or_prefix: str) -> str:
        """The full id of the one job whose id starts with `id_or_prefix` (as `trainmaster ls` shows
        8 characters, any unambiguous prefix works, as in git and docker).

        Raises JobNotFound when none matches and AmbiguousJobId when several do.
        """
        return calls.full_id(id_or_prefix) or self._send(calls.job_with_prefix(id_or_prefix))

    def get(self, job_id: str) -> JobHandle:
        return JobHandle(self, self._job(job_id))

    @takes(calls.list_jobs)
    def list(self, first: Call[Page[Job]]) -> Iterator[Job]:
        return self._pages(first)

    def cancel(self, job_id: str) -> Job:
        return self._send(calls.cancel_job(job_id))

    def events(self, job_id: str) -> builtins.list[JobEvent]:
        return builtins.list(self._pages(calls.job_events(job_id)))

    @takes(calls.job_wait)
    def wait(self, wait: JobWait) -> Job:
        return calls.succeeded(poll_until(lambda: self._job(wait.job_id), **wait.options()))

    def cluster(self) -> ClusterInfo:
        """Ray nodes with total and free resources, and the queue depth."""
        return self._send(calls.cluster())

    @takes(calls.usage_report)
    def usage(self, call: Call[Any]) -> Any:
        return self._send(call)

    def queues(self, limit: int = 20) -> Queues:
        """Each project of the caller's cluster: quota, usage, borrowed, lent, waiting jobs in admission order."""
        return self._send(calls.queues(limit))

    # -- sweeps -----------------------------------------------------------------------------------

    @takes(calls.new_sweep)
    def sweep(self, call: Call[Sweep]) -> SweepHandle:
        return SweepHandle(self, self._send(call))

    def get_sweep(self, sweep_id: str) -> SweepHandle:
        return SweepHandle(self, self._send(calls.get_sweep(sweep_id)))

    @takes(calls.list_sweeps)
    def sweeps(self, call: Call[builtins.list[Sweep]]) -> builtins.list[Sweep]:
        return self._send(call)

    def cancel_sweep(self, sweep_id: str) -> Sweep:
        return self._send(calls.cancel_sweep(sweep_id))

    # -- metrics, logs, checkpoints -------------------------------------------------------------

    @takes(calls.metric_list)
    def metrics(self, first: Call[Page[MetricValue]]) -> builtins.list[MetricValue]:
        return builtins.list(self._pages(first))

    @takes(calls.metric_pages)
    def iter_metrics(self, first: Call[Page[MetricValue]]) -> Iterator[MetricValue]:
        return self._pages(first)

    @takes(calls.metric_stream)
    def stream_metrics(self, stream: Stream[MetricValue]) -> Iterator[MetricValue]:
        return self._follow(stream)

    @takes(calls.log_reading)
    def logs(self, reading: Call[Page[LogLine]] | Stream[LogLine]) -> Iterator[LogLine]:
        return self._follow(reading) if isinstance(reading, Stream) else self._pages(reading)

    def checkpoints(self, job_id: str) -> builtins.list[CheckpointInfo]:
        return builtins.list(self._pages(calls.checkpoints(job_id)))

    def pin_checkpoint(self, job_id: str, checkpoint_id: int, pinned: bool = True) -> CheckpointInfo:
        """Keep checkpoint `checkpoint_id` (its `id` in `checkpoints`) whatever the job's policy and its
        project's retention say; `pinned=False` unpins it."""
        return self._send(calls.pin_checkpoint(job_id, checkpoint_id, pinned))

    # -- plumbing ---------------------------------------------------------------------------------

    def _job(self, job_id: str) -> Job:
        return self._send(calls.get_job(job_id))

    def _pages(self, first: Call[Page[T]]) -> Iterator[T]:
        call: Call[Page[T]] | None = first
        while call is not None:
            page = self._send(call)
            yield from page.items
            call = page.next

    def _follow(self, stream: Stream[T]) -> Iterator[T]:
        events = sse.follow(self._http, stream.path, last_event_id=stream.last_event_id, retry_for=stream.retry_for)
        for event in events:
            yield from stream.items(event)

    def _send(self, call: Call[T]) -> T:
        try:
            response = self._http.send(call.request(self._http))
        except httpx.TransportError as exc:
            raise calls.unreachable(self.api_url, exc) from exc
        return call.answer(response)

    def _send_retried(self, call: Call[T]) -> T:
        retries = Retries(max_tries=SUBMIT_ATTEMPTS)
        while True:
            try:
                return self._send(call)
            except TrainmasterError as exc:
                if (delay := retries.delay(exc)) is None:
                    raise
                time.sleep(delay)


class JobView:
    """A job's last known state, as both handles (`JobHandle`, `AsyncJobHandle`) show it."""

    def __init__(self, job: Job):
        self.info = job

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, name={self.info.name!r}, status={self.status.value!r})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def status(self) -> JobStatus:
        return self.info.status

    @contextlib.contextmanager
    def _keeping_the_end(self) -> Iterator[None]:
        """A wait that raises JobFailed still leaves the job's final state in `info`."""
        try:
            yield
        except JobFailed as exc:
            self.info = exc.job
            raise


class JobHandle(JobView):
    """A submitted job: its last known state plus the calls that act on it."""

    def __init__(self, client: Client, job: Job):
        super().__init__(job)
        self._client = client

    def refresh(self) -> Job:
        self.info = self._client._job(self.id)
        return self.info

    def wait(self, *, timeout: float | None = None, poll_interval: float = 1.0) -> Job:
        with self._keeping_the_end():
            self.info = self._client.wait(self.id, timeout=timeout, poll_interval=poll_interval)
        return self.info

    def cancel(self) -> Job:
        self.info = self._client.cancel(self.id)
        return self.info

    def events(self) -> list[JobEvent]:
        return self._client.events(self.id)

    def metrics(
        self, *, names: list[str] | None = None, since_step: int | None = None, max_points: int | None = None
    ) -> list[MetricValue]:
        return self._client.metrics(self.id, names=names, since_step=since_step, max_points=max_points)

    def iter_metrics(
        self, *, names: list[str] | None = None, since_step: int | None = None, page_size: int | None = None
    ) -> Iterator[MetricValue]:
        return self._client.iter_metrics(self.id, names=names, since_step=since_step, page_size=page_size)

    def stream_metrics(self, *, after_seq: int | None = None, retry_for: float | None = None) -> Iterator[MetricValue]:
        return self._client.stream_metrics(self.id, after_seq=after_seq, retry_for=retry_for)

    def logs(
        self, *, follow: bool = False, page_size: int = calls.LOGS_PAGE, retry_for: float | None = None
    ) -> Iterator[LogLine]:
        return self._client.logs(self.id, follow=follow, page_size=page_size, retry_for=retry_for)

    def checkpoints(self) -> list[CheckpointInfo]:
        return self._client.checkpoints(self.id)


__all__ = ["Client", "JobHandle", "JobView", "TrainmasterError"]
