"""All service settings, read once from TRAINMASTER_* environment variables."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINMASTER_", extra="ignore")

    database_url: str = "postgresql://postgres@127.0.0.1:5432/trainmaster"
    # The owner's URL, for migrations alone (`db upgrade`, `api --migrate`) when the services connect as a
    # member of the least-privilege role trainmaster_app (migration 0022); unset: database_url migrates.
    migration_database_url: str | None = None
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    max_body_bytes: int = 1024 * 1024
    max_code_bytes: int = 100 * 1024 * 1024
    max_code_files: int = 5000
    max_code_unpacked_bytes: int = 1024 * 1024 * 1024
    # Uploads one API process reads at once (each holds up to max_code_bytes), and one project's share
    # of them; past either, the upload waits code_upload_wait_s for its turn, then 429 names the limit.
    code_uploads_in_flight: int = Field(default=4, ge=1)
    code_uploads_in_flight_per_project: int = Field(default=1, ge=1)
    code_upload_wait_s: float = Field(default=10.0, ge=0)
    # What one tenant can make a shared process hold (api/dispatcher/log_cut.py, api/pages.py): a log
    # line longer than this is cut with a marker; a dispatcher's read of one job's log returns at most
    # log_read_max_chars (and a tail holds at most that); a page of logs or of any list at most
    # page_max_bytes of rows (its cursor reaches the rest).
    log_line_max_bytes: int = Field(default=8192, ge=256, le=65536)
    log_read_max_chars: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    page_max_bytes: int = Field(default=1024 * 1024, ge=64 * 1024)
    code_cache_path: str = "~/.trainmaster/code"
    storage_path: str = "~/.trainmaster/storage"
    # Where cluster records' Ray tokens are read from (`token_file`: a file in this folder, opened
    # without following links; api/clusters/token_source.py). Only the platform's operator writes here.
    secrets_path: str = "~/.trainmaster/secrets"
    api_url: str | None = None  # how training code reaches the API (given to every job)
    ray_address: str = "http://127.0.0.1:8265"  # the Ray dashboard, for the Jobs API
    ray_gcs_address: str | None = None  # host:port of the GCS; default: the dashboard host, port 6379
    dispatcher_id: str | None = None
    poll_interval_s: float = 2.0
    lease_s: float = 30.0
    infeasible_timeout_s: float = 600.0
    # Bounded waits: a job passed by later jobs of its project (smaller gangs that fitted where it did
    # not) for this long holds admission until it fits; 0: never (api/dispatcher/decide.py).
    starvation_s: float = Field(default=3600.0, ge=0)
    launch_timeout_s: float = 300.0
    # A job `starting` this long (its workers never reported) is checked with Ray: a placement group
    # of its driver that Ray created means it runs; none means the gang could not be placed: it fails.
    starting_timeout_s: float = 900.0
    # A job `starting` this long whose placement group Ray still holds PENDING (admission's book said it
    # fits, Ray says not) is stopped and queued again with Ray's reason, instead of holding its place.
    placement_timeout_s: float = 120.0
    # A job whose reconcile raises this many rounds in a row (a bug) fails with the error.
    reconcile_error_limit: int = 10
    ray_unreachable_timeout_s: float = 120.0  # active attempts are lost after this long without Ray
    collective_timeout_s: float = 1800.0  # TorchConfig(timeout_s): a hung NCCL/gloo collective fails the job
    system_metrics_interval_s: float = 5.0  # per-worker CPU, memory and GPU sampling; 0 turns it off
    driver_cpus: float = 0.0
    # Launch each job's driver through its node's warm server (workers/warm/: forked from a process
    # with Ray Train imported, about a second sooner); off: every driver starts its own Python.
    warm_driver: bool = True
    admit_batch: int = 50
    # Preemption: a higher-priority gang that cannot fit may stop lower-priority running jobs, which
    # checkpoint, return to the queue and resume. Off by default. A project's guaranteed share
    # ({"project": {"GPU": 8, "CPU": 64}}) is never preempted.
    preemption: bool = False
    preemption_grace_s: float = 60.0  # how long a preempted job has to checkpoint before it is stopped
    guaranteed_shares: dict[str, dict[str, float]] = {}
    # Fair sharing in a cohort (off by default, as in Kueue): a gang that would borrow and waits may
    # preempt jobs that run on borrowed quota of members above its project in fair share, while each
    # stays at least the margin (0.25: a quarter) above it (api/dispatcher/victims.py), so that shares
    # a gang apart do not take turns preempting each other.
    fair_share_preemption: bool = False
    fair_share_preemption_margin: float = Field(default=0.25, ge=0)
    reconcile_batch: int = 200  # active jobs followed per round; the least recently followed first
    sse_heartbeat_s: float = 15.0
    sse_send_timeout_s: float = 30.0
    max_streams_per_token: int = 16
    # Streams open at once across all of one project's tokens: a project mints tokens, so the per-token
    # cap alone bounds nothing.
    max_streams_per_project: int = Field(default=64, ge=1)
    stream_slots_dir: str | None = None  # set by `trainmaster api` so its workers share the stream cap
    db_pool_size: int = 10
    # How long an API process trusts a token it checked, without asking the database again. Revocation
    # still takes effect at once (a NOTIFY from migration 0006 evicts it); 0 turns the cache off.
    auth_cache_s: float = 5.0
    # The longest life of a token minted through POST /v1/tokens by a token that never expires; a token
    # minted by one that expires never outlives it (api/auth/service.py).
    minted_token_max_life_s: float = Field(default=90 * 86400.0, gt=0)
    metrics_public: bool = False  # serve /metrics without a token (a private scrape network)
    metrics_snapshot_s: float = 10.0  # /metrics reads the database at most this often; 0: at every scrape
    # Queued jobs whose count of older jobs of their project an API process keeps for queue positions
    # (api/queues/ranks.py: exact, dropped by a NOTIFY from migration 0008 when it may change); 0: off.
    queue_rank_cache_jobs: int = 200_000
    db_connect_timeout_s: float = 5.0
    page_limit_default: int = 50
    page_limit_max: int = 500
    mlflow_tracking_uri: str | None = None  # mirror every job's params and metrics to this MLflow server
    telemetry_interval_s: float = 5.0  # how often OpenTelemetry and MLflow export follow the database
    retention_days: float | None = None  # drop metric points and logs of jobs finished this long ago; unset: keep
    retention_batch: int = 5000  # rows deleted per transaction (short ones: ingest never waits on them)
    retention_interval_s: float = 300.0  # how often the API looks for jobs past retention
    # Code packages that no job or sweep names, uploaded (last) more than this long ago, are deleted
    # with their unpacked folder in code_cache_path on the API's host; unset: kept forever.
    code_retention_days: float | None = 30.0
    # How often a dispatcher deletes the checkpoints that nothing keeps (api/dispatcher/checkpoint_collector.py:
    # a job's checkpoint policy, pins, the project's checkpoint_retention_days); 0: never.
    # A pass reads every live checkpoint of the jobs with a policy or a retention: 1.8 s at 1,000,000
    # (bench/scale.py --sections checkpoints), hence minutes apart.
    checkpoint_gc_interval_s: float = 600.0
    # Fair sharing between projects of equal priority (migration 0020): each project's share of the
    # cluster is averaged with this half-life (a day: what a project used yesterday counts half), and
    # sampled by admission rounds this often.
    fair_share_half_life_s: float = Field(default=86400.0, gt=0)
    fair_share_sample_s: float = Field(default=30.0, gt=0)
    # How often Ray Train considers growing an elastic gang (`scaling.num_workers: {min, max}`) toward
    # its maximum while it runs (ScalingConfig.elastic_resize_monitor_interval_s; Ray's default 60 s).
    elastic_resize_interval_s: float = Field(default=60.0, ge=0)
    # What one job or one project may write into the shared database (api/limits/: a write past one is
    # refused with 429 naming it and stores nothing). Defaults sit far above what an honest job writes
    # (a 64-worker job logging 10 values a step at 5 steps a second writes 3,200 points a second) and
    # well below what one API process ingests (about 110,000 points a second), so one flooding project
    # cannot take it all. 0 turns a limit off. Rates are token buckets in each API process (several
    # processes: each allows the rate), holding `write_burst_s` seconds' worth.
    metric_names_per_job: int = Field(default=10_000, ge=0)  # distinct metric names
    metric_points_per_job_per_s: float = Field(default=20_000.0, ge=0)  # a point is one value of one name
    metric_points_per_project_per_s: float = Field(default=50_000.0, ge=0)  # all its jobs together
    events_per_job: int = Field(default=10_000, ge=0)  # job_events rows (a repeat of the latest adds none)
    events_per_project_per_s: float = Field(default=200.0, ge=0)  # events its jobs post, repeats included
    write_burst_s: float = Field(default=5.0, gt=0)
    log_lines_per_job: int = Field(default=1_000_000, ge=0)  # lines the dispatcher stores; later ones dropped
    checkpoints_per_job: int = Field(default=10_000, ge=0)  # checkpoint rows, deleted ones included
    tokens_per_project: int = Field(default=1_000, ge=0)  # live project and metrics tokens, for a project token to mint


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def async_url(url: str) -> str:
    """SQLAlchemy URL for psycopg 3, whatever spelling of postgres:// the user gave."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def libpq_url(url: str) -> str:
    """Plain libpq URL for psycopg connections opened without SQLAlchemy (LISTEN, COPY)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url
