"""Keep a job's stored log to what its code prints: each print once, none of the platform's own
HTTP client lines.

- Ray Train 2.60 replaces `print` in every worker with one that logs through the root logger and,
  because Ray wraps a worker's stdout, also prints: every line of the user's reached the log twice.
  Workers get the builtin `print` back (`print_once`).
- With the root logger at INFO (Ray Train sets it so), httpx logs every request the metrics sender
  and event poster make ("HTTP Request: POST …/metrics "HTTP/1.1 201 Created""). Those to the
  trainmaster API are dropped; the user's own httpx requests elsewhere still log
  (`quiet_platform_requests`).
- Ray's driver folds identical lines from different workers into one "[repeated Nx across
  cluster]"; a job's log keeps each worker's line (`RAY_DEDUP_LOGS=0`, set before Ray is imported).
"""

from __future__ import annotations

import builtins
import logging
import os
from typing import Any


class PlatformRequests(logging.Filter):
    """Drops httpx's request lines whose URL is the trainmaster API's."""

    def __init__(self, api_url: str):
        super().__init__()
        self.prefix = api_url.rstrip("/")

    def filter(self, record: logging.LogRecord) -> bool:
        args: Any = record.args if isinstance(record.args, tuple) else ()
        return not any(str(arg).startswith(self.prefix) for arg in args)


def quiet_platform_requests(api_url: str | None) -> None:
    if not api_url:
        return
    logger = logging.getLogger("httpx")
    if not any(isinstance(existing, PlatformRequests) for existing in logger.filters):
        logger.addFilter(PlatformRequests(api_url))


def print_once() -> None:
    try:
        from ray.train.v2._internal.logging import patch_print
    except ImportError:  # another Ray Train: nothing patched the way 2.60 does
        return
    builtins.print = patch_print._original_print


def keep_each_workers_lines() -> None:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
