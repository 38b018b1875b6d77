"""Which ended attempts are the driver's crash (queued again, not retried) rather than the job's failure."""

from __future__ import annotations

from api.dispatcher.backend import RayJobInfo, RayJobState
from api.dispatcher.ending import driver_crash

FRAMES = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0(+0x1c1461) [0x7fea9f3c1461] type_call\n"


def failed(exit_code: int | None = None) -> RayJobInfo:
    return RayJobInfo(RayJobState.FAILED, "Job entrypoint command failed", exit_code=exit_code)


def test_a_driver_killed_by_a_signal_crashed_whatever_its_output() -> None:
    assert driver_crash(failed(-6), FRAMES) == "killed by SIGABRT, exit code -6"
    assert driver_crash(failed(-9), "") == "killed by SIGKILL, exit code -9"
    assert driver_crash(failed(139), "") == "killed by SIGSEGV, exit code 139"  # through a shell that did not exec


def test_a_native_crash_report_in_the_drivers_own_output_is_a_crash() -> None:
    check = "[2026-12-05 10:00:00,000 C 1 1] core_worker.cc:300: Check failed"
    ray_check = f"{check}\n*** StackTrace Information ***\n{FRAMES}"
    assert driver_crash(failed(1), ray_check) == "a native crash: '*** StackTrace Information ***' in its output"
    python = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
    assert driver_crash(failed(), python) == "a native crash: 'Fatal Python error:' in its output"


def test_the_drivers_own_error_or_a_workers_crash_is_the_jobs_failure() -> None:
    said = f"{FRAMES}[trainmaster] error: training failed: ActorDiedError: worker exits unexpectedly by a signal\n"
    assert driver_crash(failed(-6), said) is None
    forwarded = "(RayTrainWorker pid=123) *** SIGSEGV received at time=1765000000 on cpu 0 ***\n"
    assert driver_crash(failed(1), forwarded) is None  # a worker's report, forwarded by Ray
    assert driver_crash(failed(1), "Traceback (most recent call last):\nSystemExit: 1\n") is None
    assert driver_crash(failed(), "") is None  # nothing known: a failure, as before
