"""Where the local stack (`trainmaster up`) keeps its files, and how each folder is made.

- Its home (~/.trainmaster, or TRAINMASTER_HOME): the state file (stack.json), the logs, the Ray tokens
  and the client's config. A real folder of this process's uid, mode 0700, checked and tightened on
  every `up`: tenant code never runs as this uid, so none of it can be read by a job.
- Ray's session folders: made fresh under /tmp by `tempfile.mkdtemp` (a random name, mode 0700) on every
  start and recorded in stack.json, which is how `down` finds them. A name computed from the home could
  be made first by another user, with links inside where a token would go.
- Run by root, the embedded PostgreSQL's data and the checkpoints go under /var/lib/trainmaster/<stack>
  (`service_root`): the server runs as the user `embedded_postgres`, which must pass through every folder
  above its data, and root's home (0700) is one it must not be let into. Only root may create entries in
  /var/lib, so a computed name is safe there; each folder is still checked to be root's and writable by
  root alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from trainmaster import config as client_config

SERVICE_BASE = Path("/var/lib/trainmaster")


def home() -> Path:
    return client_config.home()


def private_home() -> Path:
    """The home, made (mode 0700) if missing; an existing one must be a real folder (not a link) of this
    uid, and is made 0700 again: anything looser is tightened before the stack writes in it."""
    home().parent.mkdir(parents=True, exist_ok=True)
    return _own_folder(home(), os.geteuid(), 0o700, "set TRAINMASTER_HOME to a folder of your own")


def home_folder(name: str) -> Path:
    """A folder of the home's (`logs`), mode 0700 like the home, checked the same way."""
    return _own_folder(private_home() / name, os.geteuid(), 0o700, f"remove {home() / name}")


def _own_folder(path: Path, owner: int, mode: int, remedy: str) -> Path:
    """`path` made with `mode`, or an existing real folder of uid `owner` that no one else may write in,
    set to `mode`; checked and changed through one descriptor opened without following a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:  # a link (ELOOP) or a file (ENOTDIR)
        raise RuntimeError(f"{path} is not a folder ({exc.strerror}): refusing to use it; {remedy}") from exc
    try:
        info = os.fstat(fd)
        if info.st_uid != owner or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise RuntimeError(
                f"{path} is not this stack's (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}; "
                f"expected uid {owner}, writable by it alone): refusing to keep the stack's files there; {remedy}"
            )
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


def stack_name() -> str:
    """The stack's name in folders outside its home: from the home's path, so `up` and `down` agree."""
    return "tm-ray-" + hashlib.sha256(str(home()).encode()).hexdigest()[:8]


def session_dir() -> Path:
    """A fresh folder (mode 0700) for one Ray node's session, under /tmp: Ray keeps Unix sockets under it,
    and their paths must stay under 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="tm-ray-", dir="/tmp"))


def service_root() -> Path:
    """/var/lib/trainmaster/<stack>: root's, mode 0711 (others pass through to what is below it, and list
    nothing). Each of its two folders is made here or must already be a real folder of root's that no
    one else may write in; a looser mode is tightened."""
    for folder in (SERVICE_BASE, SERVICE_BASE / stack_name()):
        _own_folder(folder, 0, 0o711, f"remove {folder}")
    return SERVICE_BASE / stack_name()


def database_dir() -> Path:
    """The embedded PostgreSQL's data folder: under `service_root` when run by root (the server runs as
    another user), else in the home."""
    return service_root() / "pgdata" if os.geteuid() == 0 else home() / "pgdata"
