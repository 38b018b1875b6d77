"""Where a cluster's Ray token may be read from, and reading it.

The API and the dispatcher send a cluster's Ray token as a bearer header to the address its record
names, which an admin chose: a record that could name any file or environment variable of theirs
would send that (the database URL, a private key) to wherever the admin pointed. So a record names
either a file in the platform's secrets folder (`secrets_path`, which only the operator writes) or an
environment variable whose name carries the reserved prefix `TRAINMASTER_CLUSTER_TOKEN_`; anything
else is refused when registered (422 naming the field) and, for records written before the rule,
when used (`SourceRefused`, which the dispatcher logs saying what to change).

The file is opened from a descriptor of the secrets folder one component at a time with
`O_NOFOLLOW`, never by its name: a link planted inside the folder (to /etc/shadow, or to a folder
outside) is refused however it is placed, and there is no window between a check and the open.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

ENV_PREFIX = "TRAINMASTER_CLUSTER_TOKEN_"
MAX_TOKEN_BYTES = 64 * 1024  # a Ray token is 64 hex characters; anything this large is not one
FILE_RULE = (
    "a file in the platform's secrets folder ({root}, TRAINMASTER_SECRETS_PATH), named relative to it or by a "
    "path under it"
)
ENV_RULE = f"an environment variable whose name starts with {ENV_PREFIX}"


class SourceRefused(Exception):
    """A record's token source breaks the rule: `field` names which, the message says what to change."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def root(secrets_path: str) -> Path:
    return Path(secrets_path).expanduser()


def check(token_file: str | None, token_env: str | None, secrets_path: str) -> None:
    """Raise `SourceRefused` unless the record's source is allowed: an environment variable with the
    reserved prefix, or a file in the secrets folder that, if it exists, is a regular file reached
    through no link."""
    if token_env is not None and (not token_env.startswith(ENV_PREFIX) or token_env == ENV_PREFIX):
        raise SourceRefused(
            "token_env", f"{token_env!r} is not allowed: the token must be in {ENV_RULE} (e.g. {ENV_PREFIX}GPU_A)"
        )
    if token_file is not None:
        parts = relative_parts(token_file, secrets_path)
        try:
            os.close(_open(root(secrets_path), parts))
        except FileNotFoundError:
            return  # not there yet: read (and checked again) when used
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
                raise _refuse_file(token_file, secrets_path, "it is reached through a link, or is not a file") from exc


def read(token_file: str | None, token_env: str | None, secrets_path: str) -> str | None:
    """The token a record names, or None when it names none or its source is missing or empty;
    `SourceRefused` when the source breaks the rule; OSError when the file cannot be read."""
    check(token_file, token_env, secrets_path)
    if token_env is not None:
        return os.environ.get(token_env, "").strip() or None
    if token_file is None:
        return None
    try:
        fd = _open(root(secrets_path), relative_parts(token_file, secrets_path))
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read(MAX_TOKEN_BYTES).decode(errors="replace").strip() or None


def relative_parts(token_file: str, secrets_path: str) -> list[str]:
    """The file's path inside the secrets folder, as components; `SourceRefused` when it is outside or
    climbs out with `..`."""
    path = PurePosixPath(os.path.expanduser(token_file))
    if "\x00" in token_file or ".." in path.parts:
        raise _refuse_file(token_file, secrets_path, "it climbs out with '..'")
    if path.is_absolute():
        folder = PurePosixPath(os.path.normpath(root(secrets_path)))
        if not path.is_relative_to(folder) or path == folder:
            raise _refuse_file(token_file, secrets_path, "it is outside that folder")
        path = path.relative_to(folder)
    parts = [part for part in path.parts if part not in ("", ".")]
    if not parts:
        raise _refuse_file(token_file, secrets_path, "it names no file")
    return parts


def _refuse_file(token_file: str, secrets_path: str, why: str) -> SourceRefused:
    rule = FILE_RULE.format(root=root(secrets_path))
    return SourceRefused("token_file", f"{token_file!r} is not allowed ({why}): the token must be in {rule}")


def _open(folder: Path, parts: list[str]) -> int:
    """A read-only descriptor of the regular file `parts` under `folder`, no component a link."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    current = os.open(folder, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            following = os.open(part, flags | os.O_DIRECTORY, dir_fd=current)
            os.close(current)
            current = following
        fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=current)
    finally:
        os.close(current)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EISDIR, "not a regular file", parts[-1])
    return fd
