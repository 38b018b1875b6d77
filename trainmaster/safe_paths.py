"""File work on paths a job reported, which no link can redirect.

A job's code is hostile, and so is any path it reports and any folder it can write: between a check
of a resolved path and the removal of that name, the job can swap a folder for a link to anything the
remover may delete. So nothing here resolves a path. A reported path is only parsed (`inside`): it
must name, lexically, something below the job's folder (`<root>/<below...>/`), with no `..`. It is then
reached from the root, which the platform owns and opens by its configured path, one component at a
time through directory file descriptors opened with O_NOFOLLOW | O_DIRECTORY: every component from the
first one below the root down (the project's and the job's folders included) must be a real folder.
A link or a file on the way means the path is not the job's: nothing is touched, and the answer names
the component (`Result.outcome` "linked"). Inside the checkpoint, links are removed as entries and
never followed or counted.

`perform` runs a batch of removals and measurements. The rule for who does the work: when this
process is root and the root's entry a job's folder is below (the project's folder, made by the job's
cluster user, whose processes wrote everything in it; the job's folder in the older layout) is owned
by another uid, the work runs as that owner, so it can delete nothing the owner could not; otherwise
(not root, or a folder root owns) in this process. As the owner means a forked child that closes every
descriptor but its job folders' and its answer pipe, drops supplementary groups, sets the owner's own
group (its passwd entry's) and uid, works from the descriptors it inherited and leaves by os._exit.
Forked, not an interpreter started afresh: the owner need not be able to run this Python, and a
process that changed its uid stays non-dumpable, so that user's jobs can neither trace it nor read its
memory. The child takes no lock another thread may hold at the fork (it imports, logs and prints
nothing); the answer comes back as JSON through the pipe, within `timeout_s`, or the child is killed
and every request is an error.

This module imports only the standard library, and nothing of api/: workers/ use it too.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import selectors
import stat
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any

FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 64  # folders below a checkpoint; deeper is refused rather than held open
NOBODY_GID = 65534
CHILD_TIMEOUT_S = 300.0  # a batch's child, then killed: a hung mount must not stop every later pass


@dataclass
class Result:
    """What became of one path. `outcome`: removed, measured, gone (nothing there), linked or
    not_a_folder (`detail`: the component, from the root, that is a link or a file: nothing touched),
    outside (not below the job's folder), error (`detail`: why; nothing can be said)."""

    outcome: str
    detail: str = ""
    bytes: int = 0
    complete: bool = True  # a measurement that did not run out of its budget of entries


@dataclass(frozen=True)
class Request:
    kind: str  # "remove" or "measure"
    path: str  # as the job reported it
    layouts: tuple[tuple[str, ...], ...]  # the job's folder below the root, each way it may be laid out
    budget: int = 0  # entries a measurement may stat


class Refused(Exception):
    """A component on the way is a link or not a folder."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome, self.detail = outcome, detail


def inside(root: str, below: Sequence[str], path: str) -> tuple[str, ...] | None:
    """The components of `path` below `<root>/<below...>`, parsed, never resolved (`root` as configured,
    or resolved as a job's driver resolves it); None unless there is at least one, and none is `..`."""
    try:
        parts = PurePosixPath(path).parts
    except (TypeError, ValueError):
        return None
    if "\0" in path or not PurePosixPath(path).is_absolute():
        return None
    for prefix in {os.path.expanduser(root), os.path.realpath(os.path.expanduser(root))}:
        start = (*PurePosixPath(prefix).parts, *below)
        rest = parts[len(start) :]
        if parts[: len(start)] == start and rest and ".." not in rest:
            return tuple(rest)
    return None


def open_folder(name: str, parent: int, where: str) -> int:
    """`name` in the folder `parent`, opened without following a link; Refused when it is a link or
    not a folder (`where`: its path from the root, for the answer); FileNotFoundError when absent."""
    try:
        return os.open(name, FOLDER, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
    try:
        linked = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "gone", where) from None
    raise Refused("linked" if linked else "not_a_folder", where)


def walk(root: int, parts: Sequence[str], shown: str = "") -> int:
    """The folder `parts` below the open folder `root`, each component opened with `open_folder`."""
    fd = os.dup(root)
    for depth, name in enumerate(parts):
        try:
            child = open_folder(name, fd, "/".join([*filter(None, [shown]), *parts[: depth + 1]]))
        finally:
            os.close(fd)
        fd = child
    return fd


def remove(job: int, parts: Sequence[str], shown: str = "") -> Result:
    """Removes the file or tree `parts` below the job's open folder `job`."""
    try:
        parent = walk(job, parts[:-1], shown)
    except FileNotFoundError:
        return Result("gone")
    except Refused as refused:
        return Result(refused.outcome, refused.detail)
    try:
        name = parts[-1]
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return Result("gone")
        if stat.S_ISLNK(info.st_mode):
            return Result("linked", "/".join([*filter(None, [shown]), *parts]))
        if stat.S_ISDIR(info.st_mode):
            _remove_tree(parent, name, 0)
        else:
            os.unlink(name, dir_fd=parent)
        return Result("removed")
    finally:
        os.close(parent)


def _remove_tree(parent: int, name: str, depth: int) -> None:
    """Removes the folder `name` of `parent` and what it holds; a link in it goes as an entry. A folder
    swapped for a link or file meanwhile is removed as that entry, never followed."""
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, f"nested deeper than {MAX_DEPTH} folders", name)
    try:
        fd = os.open(name, FOLDER, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        os.unlink(name, dir_fd=parent)
        return
    try:
        with os.scandir(fd) as entries:
            names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
        for entry_name, is_dir in names:
            if is_dir:
                _remove_tree(fd, entry_name, depth + 1)
                continue
            try:
                os.unlink(entry_name, dir_fd=fd)
            except IsADirectoryError:  # became a folder since it was listed
                _remove_tree(fd, entry_name, depth + 1)
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def measure(job: int, parts: Sequence[str], budget: int, shown: str = "") -> Result:
    """The bytes of the regular files at `parts` below the job's open folder (each inode once; links
    neither followed nor counted), statting at most `budget` entries (`complete` False past it)."""
    try:
        parent = walk(job, parts[:-1], shown)
    except FileNotFoundError:
        return Result("gone")
    except Refused as refused:
        return Result(refused.outcome, refused.detail)
    try:
        try:
            info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return Result("gone")
        if stat.S_ISLNK(info.st_mode):
            return Result("linked", "/".join([*filter(None, [shown]), *parts]))
        if not stat.S_ISDIR(info.st_mode):
            return Result("measured", bytes=info.st_size if stat.S_ISREG(info.st_mode) else 0)
        tally = _Tally(budget)
        try:
            fd = open_folder(parts[-1], parent, parts[-1])
        except (Refused, FileNotFoundError):
            return Result("gone")  # swapped since it was statted: nothing of the job's is there now
        _count(fd, tally, 0)  # closes fd
        return Result("measured", bytes=tally.bytes, complete=tally.left >= 0)
    finally:
        os.close(parent)


class _Tally:
    def __init__(self, budget: int) -> None:
        self.left, self.bytes = budget, 0
        self.seen: set[tuple[int, int]] = set()


def _count(fd: int, tally: _Tally, depth: int) -> None:
    try:
        if depth > MAX_DEPTH:
            tally.left = -1
            return
        with os.scandir(fd) as entries:
            for entry in entries:
                tally.left -= 1
                if tally.left < 0:
                    return
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:  # gone since it was listed
                    continue
                if stat.S_ISREG(info.st_mode):
                    key = (info.st_dev, info.st_ino)
                    if info.st_nlink == 1 or key not in tally.seen:  # a hard link's inode counts once
                        tally.bytes += info.st_size
                        tally.seen.add(key)
                elif stat.S_ISDIR(info.st_mode):
                    try:
                        child = os.open(entry.name, FOLDER, dir_fd=fd)
                    except OSError:  # swapped for a link or gone since it was listed: not counted
                        continue
                    _count(child, tally, depth + 1)
                    if tally.left < 0:
                        return
    finally:
        os.close(fd)


def _work(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each item: `fd` (the job's open folder), `parts`, `kind`, `budget`, `shown`."""
    answers = []
    for item in items:
        fd, parts, shown = int(item["fd"]), list(item["parts"]), str(item["shown"])
        try:
            if item["kind"] == "remove":
                result = remove(fd, parts, shown)
            else:
                result = measure(fd, parts, int(item["budget"]), shown)
        except OSError as exc:
            result = Result("error", f"{exc.strerror or exc}"[:200])
        answers.append(asdict(result))
    return answers


def perform(root: str, requests: Sequence[Request], timeout_s: float = CHILD_TIMEOUT_S) -> list[Result]:
    """Each request's result, in order (see the module's docstring for who does the work). An error
    opening the root is raised; one that stops a child is every one of its requests' `error`."""
    results: list[Result | None] = [None] * len(requests)
    batches: dict[tuple[int, int] | None, list[tuple[int, dict[str, Any]]]] = {}
    opened: dict[tuple[str, ...], tuple[int, tuple[int, int] | None] | Result] = {}
    top = os.open(os.path.expanduser(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, request in enumerate(requests):
            found = [(below, parts) for below in request.layouts if (parts := inside(root, below, request.path))]
            if not found:
                results[index] = Result("outside")
                continue
            below, parts = found[0]
            if below not in opened:
                opened[below] = _open_job(top, below)
            job = opened[below]
            if isinstance(job, Result):
                results[index] = job
                continue
            fd, owner = job
            item = {"fd": fd, "parts": list(parts), "kind": request.kind, "budget": request.budget}
            batches.setdefault(owner, []).append((index, {**item, "shown": "/".join(below)}))
        for owner, batch in batches.items():
            answers = _as_owner(owner, [item for _, item in batch], timeout_s)
            for (index, _), answer in zip(batch, answers, strict=True):
                results[index] = answer
    finally:
        os.close(top)
        for job in opened.values():
            if not isinstance(job, Result):
                os.close(job[0])
    return [result or Result("error", "not done") for result in results]


def _open_job(top: int, below: tuple[str, ...]) -> tuple[int, tuple[int, int] | None] | Result:
    """The job's folder, open, and who works in it: None (this process) unless this process is root
    and the root's entry it is below is not owned by root: then that entry's (uid, gid)."""
    try:
        first = walk(top, below[:1])
    except FileNotFoundError:
        return Result("gone")
    except Refused as refused:
        return Result(refused.outcome, refused.detail)
    try:
        info = os.fstat(first)
        owner = (info.st_uid, _group_of(info.st_uid)) if os.geteuid() == 0 and info.st_uid != 0 else None
        try:
            return walk(first, below[1:], below[0]), owner
        except FileNotFoundError:
            return Result("gone")
        except Refused as refused:
            return Result(refused.outcome, refused.detail)
    finally:
        os.close(first)


def _group_of(uid: int) -> int:
    """The owner's own group (its passwd entry's), never the folder's: a folder root chowned to a user
    may still carry root's group. A uid with no entry gets the group of nobody."""
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return NOBODY_GID


def _as_owner(owner: tuple[int, int] | None, items: list[dict[str, Any]], timeout_s: float) -> list[Result]:
    if owner is None:
        return [Result(**answer) for answer in _work(items)]
    fds = {int(item["fd"]) for item in items}
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: this block and os._exit, nothing else (see the module's docstring)
        code = 1
        try:
            os.close(read_end)
            keep = sorted({0, 1, 2, write_end, *fds})
            for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
                os.closerange(low + 1, high)
            os.setgroups([])
            os.setgid(owner[1])
            os.setuid(owner[0])
            out = memoryview(json.dumps(_work(items)).encode())
            while out:
                out = out[os.write(write_end, out) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        answer = _read_all(read_end, timeout_s)
    finally:
        os.close(read_end)
        if answer is None:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
    why = f"the child working as uid {owner[0]} "
    if answer is None:
        return [Result("error", why + f"took more than {timeout_s:g} s and was killed") for _ in items]
    if status != 0:
        return [Result("error", why + f"failed (wait status {status})") for _ in items]
    return [Result(**one) for one in json.loads(answer)]


def _read_all(fd: int, timeout_s: float) -> bytes | None:
    """What is written to the pipe `fd` until it closes; None past `timeout_s`."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    return None
