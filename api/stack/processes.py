"""Processes on this machine: liveness, waiting, and stopping only what we started."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def bin_path(name: str) -> str:
    """A console script installed beside this Python (`trainmaster`, `ray`)."""
    return str(Path(sys.executable).with_name(name))


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    process: subprocess.Popen[bytes] | None = None,
    where: str = "the logs",
) -> None:
    """Poll `predicate` until it holds; fail early if `process` exits, and say where to look."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited; see {where}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}; see {where}")
        time.sleep(0.25)


def kill_group(pid: int) -> None:
    """SIGTERM the process group led by `pid`, then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid) and not _group_members(pid):
                return
            time.sleep(0.1)


def kill_matching(markers: list[str], timeout: float = 5.0) -> None:
    """Stop every process whose command line matches one of `markers` (regexes), with descendants."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in matching(markers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while matching(markers) and time.monotonic() < deadline:
            time.sleep(0.2)


def matching(markers: list[str]) -> set[int]:
    """Live processes whose command line matches a marker, and all their descendants."""
    parents: dict[int, int] = {}
    marked: set[int] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(proc.name)
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or pid == os.getpid():
                continue
            parents[pid] = int(fields[1])
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if any(re.search(marker, cmdline) for marker in markers):
            marked.add(pid)
    grew = True
    while grew:  # descendants rename themselves (Ray's workers show as ray::IDLE)
        found = {pid for pid, parent in parents.items() if parent in marked} - marked
        marked |= found
        grew = bool(found)
    return marked


def _group_members(pgid: int) -> list[int]:
    members = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat_file.parent.name))
    return members
