"""Checks and unpacks uploaded working directories (zip archives).

`inspect` runs at upload and reads every member to its end, so the archive `unpacked` later meets is
one that unpacks: refused are anything not a zip, member data that fails its CRC or does not
decompress, names that are not plain relative paths (absolute, drive letters, backslashes, `..`),
two members with one name (also after `a/./b` → `a/b`), a name that is both a file and a folder,
links and other special files, encrypted members, too many members, and archives that unpack past
the limit (zip bombs: judged by the sizes the archive declares, then by the bytes actually read).

`unpacked` is the dispatcher's one entry point: a content-addressed cache folder per archive,
unpacked once however many processes ask at the same time.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import re
import shutil
import stat
import tempfile
import uuid
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_NAME_BYTES = 1024  # a whole member name; each folder or file name within it at most NAME_MAX
NAME_MAX = 255
_DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
_DRIVE = re.compile(r"[A-Za-z]:")
# What reading a damaged member raises: zipfile's own checks (CRC, local header), and each
# decompressor's (bz2 reports a bad stream as OSError; from an in-memory archive it is no disk's).
_DAMAGED = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError, ValueError)


class Refused(Exception):
    """Why an uploaded archive is refused; `too_large` marks the limit on unpacked bytes (413)."""

    def __init__(self, detail: str, *, too_large: bool = False) -> None:
        super().__init__(detail)
        self.too_large = too_large


class BadPackage(Exception):
    """A stored code package that cannot be unpacked, for good: the job that needs it can only fail."""


@dataclass(frozen=True)
class ArchiveInfo:
    file_count: int
    unpacked_bytes: int


@dataclass(frozen=True)
class _Member:
    entry: zipfile.ZipInfo
    path: str  # normalised: no `.` or empty parts, no trailing slash
    is_dir: bool


def inspect(content: bytes, *, max_files: int, max_unpacked_bytes: int) -> ArchiveInfo:
    """Check the whole archive, data included; raises `Refused` naming the first bad member."""
    with _open(content) as archive:
        members = _members(archive, max_files=max_files, max_unpacked_bytes=max_unpacked_bytes)
        total = 0
        for member in members:
            if not member.is_dir:
                for chunk in _read(archive, member):
                    total += len(chunk)
                    if total > max_unpacked_bytes:  # the header's sizes may lie
                        raise _too_large(max_unpacked_bytes)
        return ArchiveInfo(file_count=sum(not m.is_dir for m in members), unpacked_bytes=total)


def unpacked(cache_root: Path, digest: str, content: bytes, *, max_files: int, max_unpacked_bytes: int) -> Path:
    """`<cache_root>/<hex digest>`, holding exactly `content`'s files: unpacked the first time, and
    again when the folder there holds anything else (a file changed, added or removed since).

    `digest` is `sha256:<hex>` (or the bare hex) and must be the archive's. Raises `BadPackage` when the
    content does not match it or cannot be unpacked (a permanent fault of the package); an `OSError`
    (disk full, permissions) is the host's and may pass. Several processes may call at once: each
    unpacks into its own staging folder and one rename wins.
    """
    match = _DIGEST.fullmatch(digest)
    if match is None:
        raise BadPackage(f"code package {digest!r} has no sha256 digest")
    hex_digest = match.group(1)
    destination = cache_root / hex_digest
    if hashlib.sha256(content).hexdigest() != hex_digest:
        raise BadPackage(f"code package sha256:{hex_digest} cannot be unpacked: its content has another digest")
    try:
        if destination.is_dir():
            if tree_digest(destination) == members_digest(content, max_files, max_unpacked_bytes):
                return destination
            discard(cache_root, hex_digest)  # altered on disk: unpacked again from the store
        return extract(content, destination, max_files=max_files, max_unpacked_bytes=max_unpacked_bytes)
    except Refused as exc:
        raise BadPackage(f"code package sha256:{hex_digest} cannot be unpacked: {exc}") from None


def tree_digest(folder: Path) -> str:
    """What a folder holds, as one digest: every file's path, executable bit and bytes, and every link
    and special file as such. Equal to `members_digest` of the archive it was unpacked from, until
    anything in it changes."""
    entries = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root, name)
            relative = path.relative_to(folder).as_posix()
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode):
                entries.append(f"{relative}\0other")
                continue
            entries.append(f"{relative}\0{bool(info.st_mode & 0o111):d}\0{_file_digest(path)}")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def members_digest(content: bytes, max_files: int, max_unpacked_bytes: int) -> str:
    """`tree_digest` of the folder `extract` makes of `content`, computed from the archive."""
    entries = []
    with _open(content) as archive:
        for member in _members(archive, max_files=max_files, max_unpacked_bytes=max_unpacked_bytes):
            if member.is_dir:
                continue
            digest = hashlib.sha256()
            for chunk in _read(archive, member):
                digest.update(chunk)
            executable = bool((member.entry.external_attr >> 16) & 0o111)
            entries.append(f"{member.path}\0{executable:d}\0{digest.hexdigest()}")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def discard(cache_root: Path, digest: str) -> None:
    """Remove a package's cache folder, if this host has one: renamed aside first, so a caller of
    `unpacked` sees the whole folder or none."""
    match = _DIGEST.fullmatch(digest)
    if match is None:
        return
    aside = cache_root / f".discard-{uuid.uuid4().hex}"
    try:
        (cache_root / match.group(1)).rename(aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def extract(content: bytes, destination: Path, *, max_files: int, max_unpacked_bytes: int) -> Path:
    """Check, then unpack into `destination` (created atomically); safe to call twice, or at once."""
    if destination.is_dir():
        return destination
    inspect(content, max_files=max_files, max_unpacked_bytes=max_unpacked_bytes)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=destination.parent))
    try:
        with _open(content) as archive:
            for member in _members(archive, max_files=max_files, max_unpacked_bytes=max_unpacked_bytes):
                target = staging / member.path
                if member.is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "xb") as sink:
                    for chunk in _read(archive, member):
                        sink.write(chunk)
                executable = (member.entry.external_attr >> 16) & 0o111
                os.chmod(target, 0o644 | (0o111 if executable else 0))
        try:
            staging.rename(destination)
        except OSError:
            if not destination.is_dir():  # another caller's rename won: its folder is the same
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return destination


def _open(content: bytes) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(io.BytesIO(content))
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as exc:
        raise Refused(f"not a zip archive ({exc}); send `zip -r - .` of your working directory") from None


def _members(archive: zipfile.ZipFile, *, max_files: int, max_unpacked_bytes: int) -> list[_Member]:
    entries = archive.infolist()
    if len(entries) > max_files:
        raise Refused(f"the archive holds {len(entries)} entries; the limit is {max_files}")
    if sum(entry.file_size for entry in entries) > max_unpacked_bytes:
        raise _too_large(max_unpacked_bytes)
    members: list[_Member] = []
    files: dict[str, str] = {}  # normalised path → the member's name as the archive spells it
    named_folders: dict[str, str] = {}
    folders: dict[str, str] = {}  # every folder named or implied (`a` of `a/b`) → a member that makes it
    for entry in entries:
        member = _member(entry)
        if member is None:
            continue
        name = entry.filename
        earlier = (named_folders if member.is_dir else files).get(member.path)
        if earlier is not None:
            raise _bad(name, f"duplicate name (as {earlier!r})")
        if not member.is_dir and member.path in folders:
            raise _bad(name, f"is a file and also a folder (of {folders[member.path]!r})")
        parts = member.path.split("/")
        for depth in range(1, len(parts) + (1 if member.is_dir else 0)):
            folder = "/".join(parts[:depth])
            if folder in files:
                raise _bad(name, f"makes {folder!r} a folder, but it is also a file ({files[folder]!r})")
            folders.setdefault(folder, name)
        (named_folders if member.is_dir else files)[member.path] = name
        members.append(member)
    return members


def _member(entry: zipfile.ZipInfo) -> _Member | None:
    """The entry with its name normalised; None for the root folder itself (`./`)."""
    name = entry.filename
    if not name or "\x00" in name or "\\" in name:
        raise _bad(name, "is not a plain relative path")
    if name.startswith("/") or _DRIVE.match(name):
        raise _bad(name, "has an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _bad(name, "climbs out of the folder with '..'")
    if len(name.encode()) > MAX_NAME_BYTES or any(len(part.encode()) > NAME_MAX for part in parts):
        raise _bad(name, f"name too long (at most {MAX_NAME_BYTES} bytes, {NAME_MAX} per part)")
    kind = stat.S_IFMT(entry.external_attr >> 16)  # 0 when the archiver recorded no type
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise _bad(name, "is a link or special file; only files and folders are accepted")
    if entry.flag_bits & 0x1:
        raise _bad(name, "is encrypted")
    is_dir = entry.is_dir() or kind == stat.S_IFDIR
    if not parts:
        if is_dir:
            return None
        raise _bad(name, "is not a plain relative path")
    return _Member(entry, "/".join(parts), is_dir)


def _read(archive: zipfile.ZipFile, member: _Member) -> Iterator[bytes]:
    """The member's bytes to the end, where zipfile checks the CRC; damage raises `Refused`."""
    try:
        with archive.open(member.entry) as source:
            while chunk := source.read(1 << 20):
                yield chunk
    except NotImplementedError as exc:  # a compression method zipfile cannot read
        raise _bad(member.entry.filename, f"cannot be read ({exc})") from None
    except _DAMAGED as exc:
        raise _bad(member.entry.filename, f"damaged data ({type(exc).__name__}: {exc})") from None


def _bad(name: str, why: str) -> Refused:
    return Refused(f"member {name!r}: {why}")


def _too_large(limit: int) -> Refused:
    return Refused(f"the archive unpacks to more than {limit} bytes", too_large=True)
