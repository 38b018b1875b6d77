"""Checks and unpacks uploaded working directories (zip archives).

Refused: anything not a zip, absolute paths, `..`, symbolic links and other special files, too
many entries, and archives that would unpack past the limit (zip bombs, judged by the sizes the
archive declares and enforced again while unpacking).
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from api.errors import PayloadTooLarge, ValidationError


@dataclass(frozen=True)
class ArchiveInfo:
    file_count: int
    unpacked_bytes: int


def _refuse(msg: str) -> ValidationError:
    return ValidationError.field(["body"], msg)


def inspect(content: bytes, *, max_files: int, max_unpacked_bytes: int) -> ArchiveInfo:
    try:
        archive = zipfile.ZipFile(io.BytesIO(content))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise _refuse(f"not a zip archive ({exc}); send `zip -r - .` of your working directory") from None
    with archive:
        entries = archive.infolist()
        if len(entries) > max_files:
            raise _refuse(f"the archive holds {len(entries)} entries; the limit is {max_files}")
        total = 0
        for entry in entries:
            _check_name(entry.filename)
            kind = stat.S_IFMT(entry.external_attr >> 16)  # 0 when the archiver recorded no type
            if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                raise _refuse(f"{entry.filename!r} is a link or special file; only files and folders are accepted")
            total += entry.file_size
            if total > max_unpacked_bytes:
                raise PayloadTooLarge(f"the archive unpacks to more than {max_unpacked_bytes} bytes")
        return ArchiveInfo(file_count=sum(1 for e in entries if not e.is_dir()), unpacked_bytes=total)


def _check_name(name: str) -> None:
    if not name or "\x00" in name or "\\" in name:
        raise _refuse(f"entry name {name!r} is not a plain relative path")
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _refuse(f"entry {name!r} has an absolute path")
    if ".." in path.parts:
        raise _refuse(f"entry {name!r} climbs out of the folder with '..'")


def extract(content: bytes, destination: Path, *, max_files: int, max_unpacked_bytes: int) -> Path:
    """Unpack into `destination` (created atomically); safe to call twice for the same archive."""
    if destination.exists():
        return destination
    inspect(content, max_files=max_files, max_unpacked_bytes=max_unpacked_bytes)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=destination.parent))
    try:
        written = 0
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            for entry in archive.infolist():
                target = (staging / entry.filename).resolve()
                if not target.is_relative_to(staging.resolve()):
                    raise _refuse(f"entry {entry.filename!r} escapes the folder")
                if entry.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(entry) as source, open(target, "wb") as sink:
                    while chunk := source.read(1 << 20):
                        written += len(chunk)
                        if written > max_unpacked_bytes:  # sizes in the header may lie
                            raise PayloadTooLarge(f"the archive unpacks to more than {max_unpacked_bytes} bytes")
                        sink.write(chunk)
                os.chmod(target, 0o644 | (0o111 if (entry.external_attr >> 16) & 0o111 else 0))
        try:
            staging.rename(destination)
        except OSError:
            if not destination.exists():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return destination
