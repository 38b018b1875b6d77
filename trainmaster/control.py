"""What the platform asks of a running job, read from `GET /v1/jobs/{id}/control`.

`trainmaster.should_checkpoint()`: true once the job is preempted by a higher-priority one: checkpoint
now (`ray.train.report(..., checkpoint=...)`); the job is then stopped, returns to the queue, and
resumes from that checkpoint. `max_workers()`: the size an elastic gang was asked to shrink to, read
by its scaling policy in the Ray Train controller (workers/elastic.py).

Both only read the last answer that one daemon thread per process refreshes every second, so they are
free to call every step. Outside a trainmaster job nothing is asked: False and None.

A process that asks `should_checkpoint()` tells the platform once (event `checkpoint_reader`), and the
first time it answers True for a request it says so first (event `preempt_seen`, one POST, before it
returns). The dispatcher then stops the job at a checkpoint registered after that, never at one the
job reported on its own just before it looked (api/dispatcher/reconcile.py, `answered_after`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx

from trainmaster.context import JobContext, post_event

POLL_S = 1.0

_answer: dict[str, Any] = {}  # the last control answer (replaced whole by the poller)
_poller: threading.Thread | None = None
_poller_pid: int | None = None
_lock = threading.Lock()
_reads_checkpoint = False  # this process asked should_checkpoint(): the poller says so once
_seen: set[str] = set()  # the requests should_checkpoint() answered True for in this process
# The events this module posts, which the dispatcher reads (api/dispatcher/reconcile.py, `answered_after`).
CHECKPOINT_READER, PREEMPT_SEEN = "checkpoint_reader", "preempt_seen"


def should_checkpoint() -> bool:
    """Whether the platform asks this job to checkpoint now (it is about to be stopped)."""
    global _reads_checkpoint
    _reads_checkpoint = True
    answer = _latest()
    if not answer.get("checkpoint"):
        return False
    request = str(answer.get("reason") or "preempted")
    if request not in _seen:
        _seen.add(request)
        post_event(PREEMPT_SEEN, f"the training code saw the request to checkpoint ({request})")
    return True


def max_workers() -> int | None:
    """The most workers the platform lets this elastic job run now (it was shrunk to make room for a
    higher-priority job), or None: no cap."""
    cap = _latest().get("max_workers")
    return cap if type(cap) is int and cap > 0 else None


def _latest() -> dict[str, Any]:
    """The last control answer, the poller started on first use in this process (a fork gets its own)."""
    global _answer, _poller, _poller_pid
    if _poller is None or _poller_pid != os.getpid():
        with _lock:
            if _poller is None or _poller_pid != os.getpid():
                context = JobContext.from_env()
                if context is None or not context.can_report:
                    return {}
                _answer = {}
                _poller = threading.Thread(target=_poll, args=(context,), name="trainmaster-control", daemon=True)
                _poller_pid = os.getpid()
                _poller.start()
    return _answer


def _poll(context: JobContext) -> None:
    global _answer
    api = context.api()
    if _reads_checkpoint:
        post_event(
            CHECKPOINT_READER,
            "the training code asks trainmaster.should_checkpoint(): a preemption stops it at the checkpoint "
            "it saves when asked",
        )
    while True:
        try:
            response = api.control()
            if response.status_code == 200:
                _answer = response.json()
        except (httpx.HTTPError, ValueError):
            pass  # the API is away: keep the last answer
        time.sleep(POLL_S)
