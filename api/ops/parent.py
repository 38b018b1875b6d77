"""A worker of `trainmaster api --workers N` ends with the process that started it.

uvicorn's supervisor starts the workers with multiprocessing; when the supervisor is killed outright
(SIGKILL, the OOM killer) its workers would live on as orphans, holding the port and serving every
open stream: clients never learn the API went away, and a new `trainmaster api` cannot bind. On
Linux the kernel sends each worker SIGTERM when its parent dies (PR_SET_PDEATHSIG), which uvicorn
turns into its graceful shutdown.
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
    """In a multiprocessing child on Linux: SIGTERM this process when its parent dies. True if armed."""
    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("could not ask to end with the API supervisor (prctl errno %s)", ctypes.get_errno())
        return False
    if os.getppid() != parent.pid:  # the parent died before the request: end now, as it would have
        os.kill(os.getpid(), signal.SIGTERM)
    return True
