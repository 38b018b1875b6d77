"""tests/factories/processes.py, the one place the tests and bench/ start processes from: stopping a
process that leads its own group (as `trainmaster api` does, its uvicorn workers in the group) ends
the whole group, not only its leader."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from tests.factories.processes import stop, wait_until

# A leader that starts a child and waits: a signal to the leader alone leaves the child running.
SLEEP = "import time; time.sleep(600)"
LEADER = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); time.sleep(600)"


def test_stop_ends_the_whole_group_of_a_leader() -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], start_new_session=True)
    children = wait_until(lambda: psutil.Process(leader.pid).children(), 30, what="the leader's child")
    stop(leader, grace_s=5)
    assert leader.returncode is not None

    def ended() -> bool:
        return not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)

    wait_until(ended, 10, what="the leader's child to end")


def test_stop_of_a_process_in_this_group_signals_it_alone() -> None:
    child = subprocess.Popen([sys.executable, "-c", SLEEP])
    assert os.getpgid(child.pid) == os.getpgid(0)
    stop(child, grace_s=5)
    assert child.returncode is not None
    assert os.getpgid(0) == os.getpgrp()  # this process (and its group) still here
