"""Fault injection for the reliability suite: die by SIGKILL at a named point of a launch.

TRAINMASTER_FAULT_POINT names the point (after_claim, after_submit, while_reconciling). Unset in
production, where `maybe_die` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = ("after_claim", "after_submit", "while_reconciling")


def maybe_die(point: str) -> None:
    if os.environ.get("TRAINMASTER_FAULT_POINT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
