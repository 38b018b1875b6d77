"""An OS user per local Ray cluster, when the stack is started by root.

Processes of one uid read each other's `/proc/<pid>/environ`, files and home: two clusters run as
one user are one trust domain whatever their Ray tokens say. Started by root (as CI runs the suite),
each local cluster's Ray processes run as an unprivileged system user of its own (`tm-<cluster>`),
with a private session folder, their own copy of the cluster's Ray token, and umask 077, so a job of
one cluster cannot read the other's processes, tokens, logs or checkpoints. Started by anyone else,
`cluster_user` is None and the clusters share the caller's uid (`trainmaster up` says so).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

PREFIX = "tm-"


@dataclass(frozen=True)
class OsUser:
    name: str
    uid: int
    gid: int


def user_name(cluster: str) -> str:
    """The OS user of local cluster `cluster`: `tm-` and the name, lower-cased, other characters as `-`."""
    return (PREFIX + "".join(c if c.isalnum() or c in "-_" else "-" for c in cluster.lower()))[:32]


def cluster_user(cluster: str) -> OsUser | None:
    """The system user the Ray processes of local cluster `cluster` run as, created on first use; None
    unless this process runs as root."""
    if os.geteuid() != 0:
        return None
    name = user_name(cluster)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = None
    if entry is None:
        made = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", "/usr/sbin/nologin", "--comment", f"trainmaster cluster {cluster}", name],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if made.returncode not in (0, 9):  # 9: created meanwhile by another process
            raise RuntimeError(f"useradd {name} failed: {made.stderr.strip()}: create it, or run `up` as a normal user")
        entry = pwd.getpwnam(name)
    return OsUser(name, entry.pw_uid, entry.pw_gid)


def cannot_run_python(name: str) -> str | None:
    """Why user `name` (neither owner nor group of the platform's files) cannot run this process's Python
    with Ray: a folder on the way to the interpreter or to Ray's package that others may not enter (pyenv
    under /root, mode 0700), or a package folder they may not read. None when it can. Only other users'
    permission bits are read, so it holds for a user that does not exist yet."""
    ray = importlib.util.find_spec("ray")
    package = Path(ray.origin).parent if ray is not None and ray.origin else None
    for target in filter(None, (Path(sys.executable), Path(sys.executable).resolve(), package)):
        if why := cannot_reach(name, target):
            return why + f", or install Python and the virtual environment where {name} can run them"
    if package is not None and not package.stat().st_mode & stat.S_IROTH:
        return f"{name} cannot read {package}: make the virtual environment readable by other users"
    return None


def cannot_reach(name: str, target: Path) -> str | None:
    """Why user `name` (not the owner or group of `target`'s folders) cannot pass through the folders on
    the way to `target`, and the chmod that lets it pass without letting it list them; None when it can."""
    for folder in reversed(target.parents):
        mode = stat.S_IMODE(folder.stat().st_mode)
        if not mode & stat.S_IXOTH:
            return (
                f"{name} cannot enter {folder} (mode {mode:o}) on the way to {target}: `chmod o+x {folder}` "
                f"(e.g. mode {mode | 0o011:o}: others may pass through it, not list it)"
            )
    return None


def usable_cluster_user(cluster: str) -> OsUser | None:
    """`cluster_user(cluster)` when that user can run this Python (`cannot_run_python`), else None: what
    a cluster started here runs as."""
    user = cluster_user(cluster)
    return user if user is not None and cannot_run_python(user.name) is None else None


PRIVATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def private_dir(path: Path, user: OsUser | None) -> Path:
    """`path`, a folder its owner alone may enter: `user`, or this process's uid.

    Made here (mode 0700) when missing. One that exists is used only when it is a real folder (not a
    link) of mode 0700 owned by `user` or by this process (then given to `user`): a folder someone else
    made, or let others into, may hold links where our files would go, so it is refused, never adopted
    because its name matched. What is checked is the opened folder (fstat), and it is changed through
    that descriptor, so a swap of the name in between changes nothing."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        made = False
    else:
        made = True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:  # a link (ELOOP) or a file (ENOTDIR)
        raise RuntimeError(f"{path} is not a folder ({exc.strerror}): refusing to use it") from exc
    try:
        info = os.fstat(fd)
        owners = {os.geteuid(), *([user.uid] if user else [])}
        if not made and (info.st_uid not in owners or stat.S_IMODE(info.st_mode) != 0o700):
            raise RuntimeError(
                f"{path} exists and is not a private folder of this stack (owner uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):o}): refusing to use it; remove it, or stop what made it"
            )
        os.fchmod(fd, 0o700)  # mkdir's mode is cut by the umask
        if user is not None and info.st_uid != user.uid:
            os.fchown(fd, user.uid, user.gid)
    finally:
        os.close(fd)
    return path


def write_private(path: Path, data: bytes, user: OsUser | None = None) -> Path:
    """`data` in a new file `path` (mode 0600) that nothing was at: created with O_EXCL|O_NOFOLLOW, so a
    file or link planted there is refused, never written through; given to `user` through its descriptor."""
    try:
        fd = os.open(path, PRIVATE_FILE, 0o600)
    except FileExistsError:
        raise RuntimeError(f"{path} exists already: refusing to write a secret through whatever is there") from None
    with os.fdopen(fd, "wb") as out:
        os.fchmod(fd, 0o600)
        if user is not None:
            os.fchown(fd, user.uid, user.gid)
        out.write(data)
    return path


def replace_private(path: Path, data: bytes) -> Path:
    """`path` replaced by a new file (mode 0600) holding `data`: written under a fresh random name beside it
    (`write_private`) and renamed over it; a rename replaces a link at `path`, never follows it. For a folder
    only this process's uid may write in (the stack's home)."""
    fresh = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    write_private(fresh, data)
    try:
        os.replace(fresh, path)
    except BaseException:
        fresh.unlink(missing_ok=True)
        raise
    return path


def append_private(path: Path) -> BinaryIO:
    """`path` opened to append (created mode 0600), never through a link: a log of the stack's."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "ab")


def own_copy(source: Path, folder: Path, user: OsUser) -> Path:
    """A copy of `source` in `folder` (`private_dir`), owned by `user` and readable by it alone; refused
    when anything (a link above all) is already at the copy's name."""
    return write_private(folder / source.name, source.read_bytes(), user)


def shared_root(path: Path) -> Path:
    """A folder that processes of every cluster user may create their own entries in and enter, but not
    list (mode 1733, like a mail spool): each project's folder is then made by its job, private to that
    job's cluster user (umask 077). Its parents are made traversable (0711) where they are created here."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for parent in missing[1:]:
        parent.chmod(0o711)
    path.chmod(0o1733)
    return path
