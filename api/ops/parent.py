"""A worker of `trainmaster api --workers N` ends with the process that started it.

uvicorn's supervisor starts the workers with multiprocessing; when the supervisor is killed outright
(SIGKILL, the OOM killer) its workers would live on as orphans, holding the port and serving every
open stream: clients never learn the API went away, and a new `trainmaster api` cannot bind. On
Linux the kernel sends each worker SIGKILL when its parent dies (PR_SET_PDEATHSIG): the supervisor
only dies before its workers when it was killed itself (a graceful stop ends the workers first), and
the API then ends as one process would. SIGTERM was not enough: uvicorn's graceful shutdown notices
it on its next 0.1 s tick and kept accepting on the shared port meanwhile, so a request right after
the kill was still answered (tests/e2e/test_metrics_live.py).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys

log = logging.getLogger("trainmaster.api")

PR_SET_PDEATHSIG = 1


def end_with_parent() -> bool:
    """In a multiprocessing child on Linux: SIGKILL this process when its parent dies. True if armed."""
    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("end_with_parent_refused", extra={"errno": ctypes.get_errno()})
        return False
    if os.getppid() != parent.pid:  # the parent died before the request: end now, as it would have
        os.kill(os.getpid(), signal.SIGKILL)
    return True
