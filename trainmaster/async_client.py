"""`trainmaster.AsyncClient`: the SDK for asyncio code, on `httpx.AsyncClient`.

Every call of `Client` is here, awaited; what returns an iterator there returns an async iterator here
(`list`, `iter_metrics`, `stream_metrics`, `logs`). Requests, answers, pages, errors and the retry rules
are the ones `Client` uses (`trainmaster.calls`, `trainmaster.retry`); only the sending and the sleeping
are asyncio's.

    async with tm.AsyncClient() as client:
        job = await client.submit(name="mnist", entrypoint="script:train.py", working_dir=".")
        async for point in job.stream_metrics():
            print(point.step, point.values)
        await job.wait()
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from trainmaster import calls, sse
from trainmaster import config as client_config
from trainmaster.calls import DEFAULT_TIMEOUT, SUBMIT_ATTEMPTS, Call, JobWait, Page, Stream, Submission, takes
from trainmaster.client import JobView
from trainmaster.errors import TrainmasterError
from trainmaster.models import (
    CheckpointInfo,
    ClusterInfo,
    CodeUpload,
    Job,
    JobEvent,
    LogLine,
    MetricValue,
    Queues,
    Sweep,
)
from trainmaster.polling import poll_until_async
from trainmaster.retry import Retries
from trainmaster.sweeps import AsyncSweepHandle

T = TypeVar("T")


class AsyncClient:
    """Talks to the trainmaster API from asyncio code: `Client`'s calls, awaited.

    Configured like `Client` (arguments, then TRAINMASTER_API_URL / TRAINMASTER_TOKEN, then
    ~/.trainmaster/config). Use `async with tm.AsyncClient() as client:`, or `await client.aclose()`,
    so its connections close. Pass an `httpx.AsyncBaseTransport` as `transport` to drive an app in
    process (`httpx.ASGITransport`).
    """

    def __init__(
        self,
        api_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        resolved = client_config.resolve(api_url, token)
        self.api_url = resolved.api_url
        options = calls.http_options(self.api_url, resolved.token, timeout)
        self._http = httpx.AsyncClient(transport=transport, **options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def closed(self) -> bool:
        return self._http.is_closed

    # -- jobs -------------------------------------------------------------------------------------

    @takes(calls.submission)
    async def submit(self, submission: Submission) -> AsyncJobHandle:
        package = None if submission.working_dir is None else await asyncio.to_thread(submission.code_package)
        code = None if package is None else (await self._upload(package)).id
        return AsyncJobHandle(self, await self._send_retried(submission.call(code)))

    async def upload_code(
        self, working_dir: str | Path, *, include_secrets: bool = False, include_git: bool = False
    ) -> CodeUpload:
        """Zip a working directory as `trainmaster run` does (in a thread, so the event loop goes on)
        and upload it unless the project holds that package already (`Client.upload_code`)."""
        options = {"include_secrets": include_secrets, "include_git": include_git}
        return await self._upload(await asyncio.to_thread(calls.code_package, working_dir, **options))

    async def _upload(self, package: calls.CodePackage) -> CodeUpload:
        return package.as_stored() if await self._send(package.stored()) else await self._send(package.upload())

    async def resolve_id(self, id_or_prefix: str) -> str:
        """The full id of the one job whose id starts with `id_or_prefix` (`Client.resolve_id`)."""
        whole = calls.full_id(id_or_prefix)
        return whole if whole is not None else await self._send(calls.job_with_prefix(id_or_prefix))

    async def get(self, job_id: str) -> AsyncJobHandle:
        return AsyncJobHandle(self, await self._job(job_id))

    @takes(calls.list_jobs)
    def list(self, first: Call[Page[Job]]) -> AsyncIterator[Job]:
        return self._pages(first)

    async def cancel(self, job_id: str) -> Job:
        return await self._send(calls.cancel_job(job_id))

    async def events(self, job_id: str) -> builtins.list[JobEvent]:
        return [event async for event in self._pages(calls.job_events(job_id))]

    @takes(calls.job_wait)
    async def wait(self, wait: JobWait) -> Job:
        return calls.succeeded(await poll_until_async(lambda: self._job(wait.job_id), **wait.options()))

    async def cluster(self) -> ClusterInfo:
        """Ray nodes with total and free resources, and the queue depth."""
        return await self._send(calls.cluster())

    @takes(calls.usage_report)
    async def usage(self, call: Call[Any]) -> Any:
        return await self._send(call)

    async def queues(self, limit: int = 20) -> Queues:
        """Each project of the caller's cluster: quota, usage, borrowed, lent, waiting jobs in admission order."""
        return await self._send(calls.queues(limit))

    # -- sweeps -----------------------------------------------------------------------------------

    @takes(calls.new_sweep)
    async def sweep(self, call: Call[Sweep]) -> AsyncSweepHandle:
        return AsyncSweepHandle(self, await self._send(call))

    async def get_sweep(self, sweep_id: str) -> AsyncSweepHandle:
        return AsyncSweepHandle(self, await self._send(calls.get_sweep(sweep_id)))

    @takes(calls.list_sweeps)
    async def sweeps(self, call: Call[builtins.list[Sweep]]) -> builtins.list[Sweep]:
        return await self._send(call)

    async def cancel_sweep(self, sweep_id: str) -> Sweep:
        return await self._send(calls.cancel_sweep(sweep_id))

    # -- metrics, logs, checkpoints -------------------------------------------------------------

    @takes(calls.metric_list)
    async def metrics(self, first: Call[Page[MetricValue]]) -> builtins.list[MetricValue]:
        return [value async for value in self._pages(first)]

    @takes(calls.metric_pages)
    def iter_metrics(self, first: Call[Page[MetricValue]]) -> AsyncIterator[MetricValue]:
        return self._pages(first)

    @takes(calls.metric_stream)
    def stream_metrics(self, stream: Stream[MetricValue]) -> AsyncIterator[MetricValue]:
        return self._follow(stream)

    @takes(calls.log_reading)
    def logs(self, reading: Call[Page[LogLine]] | Stream[LogLine]) -> AsyncIterator[LogLine]:
        return self._follow(reading) if isinstance(reading, Stream) else self._pages(reading)

    async def checkpoints(self, job_id: str) -> builtins.list[CheckpointInfo]:
        return [checkpoint async for checkpoint in self._pages(calls.checkpoints(job_id))]

    async def pin_checkpoint(self, job_id: str, checkpoint_id: int, pinned: bool = True) -> CheckpointInfo:
        """Keep checkpoint `checkpoint_id` (its `id` in `checkpoints`) whatever the job's policy and its
        project's retention say; `pinned=False` unpins it."""
        return await self._send(calls.pin_checkpoint(job_id, checkpoint_id, pinned))

    # -- plumbing ---------------------------------------------------------------------------------

    async def _job(self, job_id: str) -> Job:
        return await self._send(calls.get_job(job_id))

    async def _pages(self, first: Call[Page[T]]) -> AsyncIterator[T]:
        call: Call[Page[T]] | None = first
        while call is not None:
            page = await self._send(call)
            for item in page.items:
                yield item
            call = page.next

    async def _follow(self, stream: Stream[T]) -> AsyncIterator[T]:
        path, resume, retry_for = stream.path, stream.last_event_id, stream.retry_for
        async for event in sse.follow_async(self._http, path, last_event_id=resume, retry_for=retry_for):
            for item in stream.items(event):
                yield item

    async def _send(self, call: Call[T]) -> T:
        try:
            response = await self._http.send(call.request(self._http))
        except httpx.TransportError as exc:
            raise calls.unreachable(self.api_url, exc) from exc
        return call.answer(response)

    async def _send_retried(self, call: Call[T]) -> T:
        retries = Retries(max_tries=SUBMIT_ATTEMPTS)
        while True:
            try:
                return await self._send(call)
            except TrainmasterError as exc:
                if (delay := retries.delay(exc)) is None:
                    raise
                await asyncio.sleep(delay)


class AsyncJobHandle(JobView):
    """A submitted job for `AsyncClient`: its last known state plus the calls that act on it, awaited."""

    def __init__(self, client: AsyncClient, job: Job):
        super().__init__(job)
        self._client = client

    async def refresh(self) -> Job:
        self.info = await self._client._job(self.id)
        return self.info

    async def wait(self, *, timeout: float | None = None, poll_interval: float = 1.0) -> Job:
        with self._keeping_the_end():
            self.info = await self._client.wait(self.id, timeout=timeout, poll_interval=poll_interval)
        return self.info

    async def cancel(self) -> Job:
        self.info = await self._client.cancel(self.id)
        return self.info

    async def events(self) -> list[JobEvent]:
        return await self._client.events(self.id)

    async def metrics(
        self, *, names: list[str] | None = None, since_step: int | None = None, max_points: int | None = None
    ) -> list[MetricValue]:
        return await self._client.metrics(self.id, names=names, since_step=since_step, max_points=max_points)

    def iter_metrics(
        self, *, names: list[str] | None = None, since_step: int | None = None, page_size: int | None = None
    ) -> AsyncIterator[MetricValue]:
        return self._client.iter_metrics(self.id, names=names, since_step=since_step, page_size=page_size)

    def stream_metrics(
        self, *, after_seq: int | None = None, retry_for: float | None = None
    ) -> AsyncIterator[MetricValue]:
        return self._client.stream_metrics(self.id, after_seq=after_seq, retry_for=retry_for)

    def logs(
        self, *, follow: bool = False, page_size: int = calls.LOGS_PAGE, retry_for: float | None = None
    ) -> AsyncIterator[LogLine]:
        return self._client.logs(self.id, follow=follow, page_size=page_size, retry_for=retry_for)

    async def checkpoints(self) -> list[CheckpointInfo]:
        return await self._client.checkpoints(self.id)


__all__ = ["AsyncClient", "AsyncJobHandle"]
