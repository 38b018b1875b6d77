"""`trainmaster.should_checkpoint()`: the platform asking running training code to save its work.

True once the job is preempted by a higher-priority one: checkpoint now (`ray.train.report(...,
checkpoint=...)`); the job is then stopped, returns to the queue, and resumes from that checkpoint.
The call only reads a flag that a daemon thread refreshes every second from
`GET /v1/jobs/{id}/control`, so it is free to call every step. Outside a trainmaster job it is always
False.
"""

from __future__ import annotations

import os
import threading
import time

import httpx

from trainmaster.context import JobContext

POLL_S = 1.0

_asked = threading.Event()
_poller: threading.Thread | None = None
_poller_pid: int | None = None
_lock = threading.Lock()


def should_checkpoint() -> bool:
    """Whether the platform asks this job to checkpoint now (it is about to be stopped)."""
    global _poller, _poller_pid
    if _poller is None or _poller_pid != os.getpid():
        with _lock:
            if _poller is None or _poller_pid != os.getpid():
                context = JobContext.from_env()
                if context is None or not context.can_report:
                    return False
                _asked.clear()
                _poller = threading.Thread(target=_poll, args=(context,), name="trainmaster-control", daemon=True)
                _poller_pid = os.getpid()
                _poller.start()
    return _asked.is_set()


def _poll(context: JobContext) -> None:
    api = context.api()
    while True:
        try:
            response = api.control()
            if response.status_code == 200:
                if response.json().get("checkpoint"):
                    _asked.set()
                else:
                    _asked.clear()
        except (httpx.HTTPError, ValueError):
            pass  # the API is away: keep the last answer
        time.sleep(POLL_S)


def max_workers() -> int | None:
    """The most workers the platform lets this elastic job run now (it was shrunk to make room for a
    higher-priority job), or None: no cap, outside a job, or the API away (the last cap stays with
    its caller). One request; workers/elastic.py asks every few seconds."""
    context = JobContext.from_env()
    if context is None or not context.can_report:
        return None
    api = context.api()
    try:
        response = api.control()
        if response.status_code != 200:
            return None
        cap = response.json().get("max_workers")
        return cap if type(cap) is int and cap > 0 else None
    except (httpx.HTTPError, ValueError):
        return None
    finally:
        api.close()
