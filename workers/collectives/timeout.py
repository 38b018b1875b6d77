"""The collective timeout: a hung NCCL or gloo collective ends the job, and the error says so.

The dispatcher passes the `collective_timeout_s` setting to the driver as
TRAINMASTER_COLLECTIVE_TIMEOUT_S (a job's `env` may set its own); the torch launcher
(workers/frameworks/torch.py) gives it to `LeanTorchConfig(timeout_s=...)`, which becomes the process
group's timeout. When a collective
exceeds it, the NCCL watchdog (or gloo) raises, the worker fails and Ray Train fails the run.
The raw error names a watchdog or a recv; `explain_failure` turns that into a reason a person
reading `trainmaster get` understands.
"""

from __future__ import annotations

import os
import re

from trainmaster.context import DEFAULT_COLLECTIVE_TIMEOUT_S, ENV_COLLECTIVE_TIMEOUT_S, ENV_JOB_ID, JobContext

TIMEOUT_SIGNS = (
    re.compile(r"watchdog caught collective operation timeout", re.IGNORECASE),  # ProcessGroupNCCL
    re.compile(r"ran for \d+ milliseconds before timing out", re.IGNORECASE),  # ProcessGroupNCCL
    re.compile(r"timed out waiting \d+ ?ms for (recv|send)", re.IGNORECASE),  # gloo transport
    re.compile(r"NCCLHangError", re.IGNORECASE),  # Ray Train's NCCL RAS hang detector
    re.compile(r"(nccl|gloo|collective|distbackenderror).*timed? ?out", re.IGNORECASE),
)
ABORTED = re.compile(r"SIGABRT|signal 6\b|exit code -6\b", re.IGNORECASE)


def collective_timeout_s(environ: dict[str, str] | None = None) -> int:
    """Whole seconds (what TorchConfig takes), at least 1; the default when unset or unreadable."""
    context = JobContext.from_env({ENV_JOB_ID: "-", **(os.environ if environ is None else environ)})
    return max(1, round(context.collective_timeout_s if context else DEFAULT_COLLECTIVE_TIMEOUT_S))


def is_collective_timeout(error: str) -> bool:
    return any(sign.search(error) for sign in TIMEOUT_SIGNS)


def explain_failure(error: str, timeout_s: int, full_text: str | None = None) -> str:
    """`error` (one line) led by a named reason when it, or `full_text`, shows a collective timeout.

    With TORCH_NCCL_ASYNC_ERROR_HANDLING's default the NCCL watchdog aborts the worker process
    instead of raising, so Ray only sees a worker killed by SIGABRT: that gets a softer hint.
    """
    text = f"{error}\n{full_text or ''}"
    if is_collective_timeout(text):
        return (
            f"collective timeout: a collective operation did not finish within {timeout_s} s "
            f"(collective_timeout_s, {ENV_COLLECTIVE_TIMEOUT_S}); a rank hung, died or diverged. {error}"
        )
    if ABORTED.search(text):
        return (
            f"{error} (a worker was aborted, as the NCCL watchdog does when a collective exceeds the collective "
            f"timeout of {timeout_s} s: look for 'Watchdog caught collective operation timeout' in the logs)"
        )
    return error
