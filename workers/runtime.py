"""What a job's processes learn from their environment, set by the dispatcher for every attempt."""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_JOB_ID = "TRAINMASTER_JOB_ID"
ENV_ATTEMPT = "TRAINMASTER_ATTEMPT"
ENV_JOB_SPEC = "TRAINMASTER_JOB_SPEC"
ENV_API_URL = "TRAINMASTER_API_URL"
ENV_JOB_TOKEN = "TRAINMASTER_JOB_TOKEN"
ENV_STORAGE_PATH = "TRAINMASTER_STORAGE_PATH"


@dataclass(frozen=True)
class JobContext:
    job_id: str
    attempt: int
    api_url: str | None
    token: str | None

    @classmethod
    def from_env(cls) -> JobContext | None:
        job_id = os.environ.get(ENV_JOB_ID)
        if not job_id:
            return None
        return cls(
            job_id=job_id,
            attempt=int(os.environ.get(ENV_ATTEMPT, "1")),
            api_url=os.environ.get(ENV_API_URL),
            token=os.environ.get(ENV_JOB_TOKEN),
        )
