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
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PREFIX = "tm-"


@dataclass(frozen=True)
class OsUser:
    name: str
    uid: int
    gid: int


def cluster_user(cluster: str) -> OsUser | None:
    """The system user the Ray processes of local cluster `cluster` run as, created on first use; None
    unless this process runs as root."""
    if os.geteuid() != 0:
        return None
    name = (PREFIX + "".join(c if c.isalnum() or c in "-_" else "-" for c in cluster.lower()))[:32]
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


def cannot_run_python(user: OsUser) -> str | None:
    """Why `user` (neither owner nor group of the platform's files) cannot run this process's Python with
    Ray: a folder on the way to the interpreter or to Ray's package that others may not enter (pyenv
    under /root, mode 0700), or a package folder they may not read. None when it can."""
    ray = importlib.util.find_spec("ray")
    package = Path(ray.origin).parent if ray is not None and ray.origin else None
    for target in filter(None, (Path(sys.executable), Path(sys.executable).resolve(), package)):
        for folder in reversed(target.parents):
            if not folder.stat().st_mode & stat.S_IXOTH:
                return (
                    f"{user.name} cannot enter {folder} (mode {stat.S_IMODE(folder.stat().st_mode):o}) on the way to "
                    f"{target}; let other users enter it (e.g. `chmod o+x {folder}`) or install Python and the "
                    "virtual environment elsewhere"
                )
    if package is not None and not package.stat().st_mode & stat.S_IROTH:
        return f"{user.name} cannot read {package}: make the virtual environment readable by other users"
    return None


def usable_cluster_user(cluster: str) -> OsUser | None:
    """`cluster_user(cluster)` when that user can run this Python (`cannot_run_python`), else None: what
    a cluster started here runs as."""
    user = cluster_user(cluster)
    return user if user is not None and cannot_run_python(user) is None else None


def private_dir(path: Path, user: OsUser | None) -> Path:
    """`path` (created if missing) readable by its owner alone: `user`, or this process's uid."""
    path.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chown(path, user.uid, user.gid)
    path.chmod(0o700)
    return path


def own_copy(source: Path, folder: Path, user: OsUser) -> Path:
    """A copy of `source` in `folder`, owned by `user` and readable by it alone."""
    copy = folder / source.name
    shutil.copyfile(source, copy)
    os.chown(copy, user.uid, user.gid)
    copy.chmod(0o600)
    return copy


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
