"""Calls on jobs: submit, read, list (cursor pages), cancel, wait, events, checkpoints, code, cluster,
queues."""

from __future__ import annotations

import hashlib
import io
import uuid
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from trainmaster import packing
from trainmaster.calls.base import (
    AMBIGUOUS_SHOWN,
    Backend,
    Call,
    Page,
)
from trainmaster.errors import AmbiguousJobId, JobFailed, JobNotFound
from trainmaster.models import (
    CheckpointInfo,
    CheckpointList,
    CheckpointPolicy,
    ClusterInfo,
    CodeUpload,
    EventList,
    Framework,
    Job,
    JobEvent,
    JobList,
    JobSpec,
    JobStatus,
    Queues,
    Scaling,
    UsageReport,
)

# -- jobs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    """A `submit` call's arguments: the spec or its fields, and the folder to upload first (with what
    of it `packing` keeps back unless asked: secrets, `.git`)."""

    spec: JobSpec | None
    fields: dict[str, Any]
    working_dir: str | Path | None
    idempotency_key: str | None
    include_secrets: bool = False
    include_git: bool = False

    def code_package(self) -> CodePackage | None:
        if self.working_dir is None:
            return None
        return code_package(self.working_dir, include_secrets=self.include_secrets, include_git=self.include_git)

    def call(self, code: str | None) -> Call[Job]:
        """POST /v1/jobs with one Idempotency-Key for every try, so a retried submit stores one job."""
        spec = job_spec(self.spec, self.fields if code is None else {**self.fields, "code": code})
        key = self.idempotency_key or str(uuid.uuid4())
        body = spec.model_dump(mode="json", exclude_unset=False)
        return Call("POST", "/v1/jobs", Job.model_validate, json=body, headers={"Idempotency-Key": key})


def submission(
    spec: JobSpec | None = None,
    *,
    name: str | None = None,
    entrypoint: str | None = None,
    args: list[str] | None = None,
    config: dict[str, Any] | None = None,
    code: str | None = None,
    scaling: Scaling | dict[str, Any] | None = None,
    framework: Framework | str | None = None,
    backend: Backend | None = None,
    env: dict[str, str] | None = None,
    pip: list[str] | None = None,
    max_retries: int | None = None,
    max_failures: int | None = None,
    timeout_s: float | None = None,
    priority: int | None = None,
    labels: dict[str, str] | None = None,
    checkpoint: CheckpointPolicy | dict[str, Any] | None = None,
    working_dir: str | Path | None = None,
    idempotency_key: str | None = None,
    include_secrets: bool = False,
    include_git: bool = False,
) -> Submission:
    """Submit a job: a `JobSpec`, or its fields as keywords (`name` and `entrypoint` at least; given
    beside a spec, they replace its fields). Fields left out take JobSpec's defaults.

    `working_dir` is zipped and uploaded first (`upload_code`) and becomes `code`; the workers run in
    it (script mode reads the script from it, function mode imports from it). What ships of it is what
    `trainmaster run` ships (trainmaster.packing): git's ignore rules and `.trainmasterignore` apply,
    secrets (`.env`, private keys) and `.git` stay behind unless `include_secrets` / `include_git`.

    Safe to retry: one Idempotency-Key (`idempotency_key`, else a new one) covers every try of this
    call, and passing failures (`trainmaster.retry`) are tried again, 4 tries in all, so a submit
    whose answer was lost stores one job."""
    given = {field: value for field, value in locals().items() if field in JobSpec.model_fields}
    fields = {k: v for k, v in given.items() if v is not None}
    return Submission(spec, fields, working_dir, idempotency_key, include_secrets, include_git)


def job_spec(spec: JobSpec | None, fields: Mapping[str, Any]) -> JobSpec:
    """`spec` with `fields` over it (or the fields alone), validated as one JobSpec."""
    if spec is None:
        return JobSpec.model_validate(dict(fields))
    if not fields:
        return spec
    return JobSpec.model_validate({**spec.model_dump(exclude_unset=True), **fields})


@dataclass(frozen=True)
class CodePackage:
    """A zipped working directory. Its id is the API's (the zip's SHA-256), so a client asks whether
    the project holds it already (`stored`) and uploads it only when not (`upload`)."""

    content: bytes

    @property
    def id(self) -> str:
        return "sha256:" + hashlib.sha256(self.content).hexdigest()

    def stored(self) -> Call[bool]:
        return Call("HEAD", f"/v1/code/{self.id}", lambda _: True, answers={404: False, 405: False})

    def upload(self) -> Call[CodeUpload]:
        headers = {"Content-Type": "application/zip"}
        return Call("POST", "/v1/code", CodeUpload.model_validate, content=self.content, headers=headers)

    def as_stored(self) -> CodeUpload:
        """What the upload would have answered, for a package the API holds already."""
        with zipfile.ZipFile(io.BytesIO(self.content)) as archive:
            files = sum(1 for member in archive.infolist() if not member.is_dir())
        return CodeUpload(id=self.id, size=len(self.content), file_count=files)


def code_package(working_dir: str | Path, *, include_secrets: bool = False, include_git: bool = False) -> CodePackage:
    """`working_dir` packed by the one packer (`trainmaster.packing.pack`, as `trainmaster run` packs it);
    what a person should know before it ships (secrets kept back, a large package) is warned of as a
    `packing.PackageWarning`."""
    package = packing.pack(Path(working_dir), include_git=include_git, include_secrets=include_secrets)
    for message in package.warnings(secrets_option="include_secrets=True"):
        warnings.warn(message, packing.PackageWarning, stacklevel=4)
    return CodePackage(package.content)


def get_job(job_id: str) -> Call[Job]:
    return Call("GET", f"/v1/jobs/{job_id}", Job.model_validate)


def cancel_job(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{job_id}/cancel", Job.model_validate)


def job_events(job_id: str) -> Call[Page[JobEvent]]:
    """Every event of the job, oldest first, a page at a time (`_id_pages`)."""
    return _id_pages(f"/v1/jobs/{job_id}/events", lambda data: EventList.model_validate(data), 0)


def checkpoints(job_id: str) -> Call[Page[CheckpointInfo]]:
    """Every checkpoint of the job, oldest first, a page at a time (`_id_pages`)."""
    return _id_pages(f"/v1/jobs/{job_id}/checkpoints", lambda data: CheckpointList.model_validate(data), 0)


def _id_pages(path: str, listed: Callable[[Any], EventList | CheckpointList], after_id: int) -> Call[Page[Any]]:
    """Pages of a job's rows by id: the API ends a page at `limit` or at the bytes one may hold and says
    where the next starts (`next_after_id`); none said, this page is the last."""

    def page(data: Any) -> Page[Any]:
        rows = listed(data)
        following = rows.next_after_id
        return Page(list(rows.items), None if following is None else _id_pages(path, listed, following))

    return Call("GET", path, page, params={"after_id": after_id})


def pin_checkpoint(job_id: str, checkpoint_id: int, pinned: bool = True) -> Call[CheckpointInfo]:
    """Keep a checkpoint whatever the job's policy and its project's retention say (False: unpin)."""
    return Call(
        "POST" if pinned else "DELETE",
        f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/pin",
        CheckpointInfo.model_validate,
    )


def cluster() -> Call[ClusterInfo]:
    return Call("GET", "/v1/cluster", ClusterInfo.model_validate)


def usage_report(
    group_by: str = "project",
    start: datetime | None = None,
    end: datetime | None = None,
    granularity: str | None = None,
    project: str | None = None,
    *,
    csv: bool = False,
) -> Call[Any]:
    """Resource-hours (allocated, starting, productive, lost), queue time and goodput of the attempts
    that ended in [start, end), per project, user, job or `label:<key>` (and hour or day). A UsageReport;
    with `csv`, the CSV the server writes (`Accept: text/csv`)."""
    given = {"group_by": group_by, "from": start, "to": end, "granularity": granularity, "project": project}
    params = {key: value.isoformat() if isinstance(value, datetime) else value for key, value in given.items() if value}
    if csv:
        return Call("GET", "/v1/usage", str, params=params, headers={"Accept": "text/csv"}, text=True)
    return Call("GET", "/v1/usage", UsageReport.model_validate, params=params)


def queues(limit: int = 20) -> Call[Queues]:
    return Call("GET", "/v1/queues", Queues.model_validate, params={"limit": limit})


def full_id(id_or_prefix: str) -> str | None:
    """The id itself when it is a whole one (no request needed), else None."""
    try:
        return str(uuid.UUID(id_or_prefix.strip().lower()))
    except ValueError:
        return None


def job_with_prefix(id_or_prefix: str) -> Call[str]:
    """The full id of the one job whose id starts with `id_or_prefix`; JobNotFound when none does,
    AmbiguousJobId when several do."""

    def only_one(data: Any) -> str:
        ids = [job.id for job in JobList.model_validate(data).items]
        if not ids:
            raise JobNotFound(f"404 JobNotFound: no job whose id starts with {id_or_prefix!r}")
        if len(ids) > 1:
            raise AmbiguousJobId(id_or_prefix, ids)
        return ids[0]

    params = {"id_prefix": id_or_prefix.strip().lower(), "limit": AMBIGUOUS_SHOWN + 1}
    return Call("GET", "/v1/jobs", only_one, params=params)


def list_jobs(
    *,
    status: JobStatus | str | list[JobStatus | str] | None = None,
    labels: dict[str, str] | None = None,
    limit: int | None = None,
    page_size: int = 100,
) -> Call[Page[Job]]:
    """Jobs newest first, following cursors until `limit` jobs or the end."""
    statuses = status if isinstance(status, list) else [status] if status else []
    params: dict[str, Any] = {
        "status": [s.value if isinstance(s, JobStatus) else s for s in statuses],
        "label": [f"{k}:{v}" for k, v in (labels or {}).items()],
        "limit": min(page_size, limit) if limit else page_size,
    }
    return _job_pages(params, limit)


def _job_pages(params: dict[str, Any], left: int | None) -> Call[Page[Job]]:
    def page(data: Any) -> Page[Job]:
        answer = JobList.model_validate(data)
        items = answer.items if left is None else answer.items[:left]
        remaining = None if left is None else left - len(items)
        more = answer.next_cursor is not None and remaining != 0
        return Page(items, _job_pages({**params, "cursor": answer.next_cursor}, remaining) if more else None)

    return Call("GET", "/v1/jobs", page, params=params)


@dataclass(frozen=True)
class JobWait:
    job_id: str
    timeout: float | None
    poll_interval: float

    def options(self) -> dict[str, Any]:
        """`poll_until`'s: until the job's status is terminal."""
        done: Callable[[Job], bool] = lambda job: job.status.terminal  # noqa: E731
        what = f"job {self.job_id}"
        return {"done": done, "what": what, "timeout": self.timeout, "poll_interval": self.poll_interval}


def job_wait(job_id: str, *, timeout: float | None = None, poll_interval: float = 1.0) -> JobWait:
    """Wait until the job ends; return it if it succeeded, raise JobFailed otherwise, WaitTimeout after
    `timeout` s. The API being unreachable, 503 or 429 is waited out (honouring Retry-After) for as
    long as the wait lasts; 401, 404 and other refusals raise at once."""
    return JobWait(job_id, timeout, poll_interval)


def succeeded(job: Job) -> Job:
    """The job a wait ended with, when it succeeded; JobFailed (with its error) when it ended otherwise."""
    if job.status is not JobStatus.succeeded:
        raise JobFailed(job)
    return job
