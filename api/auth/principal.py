"""Who is calling: what `authenticate` (service.py) answers and the token cache (cache.py) keeps."""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    """A project, and for a job-scoped token the one job it may write."""

    project_id: uuid.UUID
    project_name: str
    job_id: uuid.UUID | None = None
    token_id: uuid.UUID | None = None

    @property
    def is_job_token(self) -> bool:
        return self.job_id is not None
