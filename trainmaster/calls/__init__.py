"""The API's calls as data, shared by `Client` and `AsyncClient`.

Each function here builds a `Call`: the method, path, query, body and headers of one request and how
its answer becomes a model. A client only sends it (`httpx.Client` or `httpx.AsyncClient`) and hands
the response back to `Call.answer`, which maps error statuses to the exception tree. Calls that page
answer a `Page` whose `next` is the call for the following page (a cursor or the last `seq`), or None
at the end, so both clients follow pages without knowing how the API pages.
"""

from trainmaster.calls.base import (
    DEFAULT_TIMEOUT,
    LOGS_PAGE,
    SUBMIT_ATTEMPTS,
    Backend,
    Call,
    Page,
    Stream,
    http_options,
    takes,
    unreachable,
)
from trainmaster.calls.jobs import (
    CodePackage,
    JobWait,
    Submission,
    cancel_job,
    checkpoints,
    cluster,
    code_package,
    full_id,
    get_job,
    job_events,
    job_spec,
    job_wait,
    job_with_prefix,
    list_jobs,
    pin_checkpoint,
    queues,
    submission,
    succeeded,
    usage_report,
)
from trainmaster.calls.metrics import log_reading, metric_list, metric_pages, metric_stream
from trainmaster.calls.sweeps import cancel_sweep, get_sweep, list_sweeps, new_sweep

__all__ = [
    "DEFAULT_TIMEOUT",
    "LOGS_PAGE",
    "SUBMIT_ATTEMPTS",
    "Backend",
    "Call",
    "CodePackage",
    "JobWait",
    "Page",
    "Stream",
    "Submission",
    "cancel_job",
    "cancel_sweep",
    "checkpoints",
    "cluster",
    "code_package",
    "full_id",
    "get_job",
    "get_sweep",
    "http_options",
    "job_events",
    "job_spec",
    "job_wait",
    "job_with_prefix",
    "list_jobs",
    "list_sweeps",
    "log_reading",
    "metric_list",
    "metric_pages",
    "metric_stream",
    "new_sweep",
    "pin_checkpoint",
    "queues",
    "submission",
    "succeeded",
    "takes",
    "unreachable",
    "usage_report",
]
