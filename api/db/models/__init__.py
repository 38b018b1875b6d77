"""SQLAlchemy 2.0 models: the one source the Alembic revisions are checked against
(tests/integration/test_migrations.py compares them with `Base.metadata`).

One module per area, all on the one `Base` of base.py; this package imports every one of them, so
`Base.metadata` holds every table once `api.db.models` is imported, and every model is importable
from here. Tables refer to each other by table name (`ForeignKey("jobs.id")`) and relationships by
class name, so an area imports another only for a relationship's type (jobs.py imports tenancy.py)."""

from api.db.models.base import (
    NAMING_CONVENTION,
    Base,
    attempt_status_enum,
    inserted_at,
    job_status_enum,
    sweep_status_enum,
)
from api.db.models.jobs import Job, JobAttempt, JobEvent, QueueCount
from api.db.models.metrics_and_logs import LogLine, MetricBatch, MetricBlock, MetricPoint
from api.db.models.storage import Checkpoint, CodePackage, ProjectStorage
from api.db.models.sweeps import Sweep, SweepTrial
from api.db.models.tenancy import ApiToken, ClusterRow, Project
from api.db.models.usage import ProjectUsage, UsageDay, UsageFigures, UsageHour

__all__ = [
    "NAMING_CONVENTION",
    "ApiToken",
    "Base",
    "Checkpoint",
    "ClusterRow",
    "CodePackage",
    "Job",
    "JobAttempt",
    "JobEvent",
    "LogLine",
    "MetricBatch",
    "MetricBlock",
    "MetricPoint",
    "Project",
    "ProjectStorage",
    "ProjectUsage",
    "QueueCount",
    "Sweep",
    "SweepTrial",
    "UsageDay",
    "UsageFigures",
    "UsageHour",
    "attempt_status_enum",
    "inserted_at",
    "job_status_enum",
    "sweep_status_enum",
]
