"""Zip a working directory for upload, reproducibly (same files, same bytes, same id)."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path

SKIP_DIRS = {
    ".git",
    ".hg",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "node_modules",
    ".trainmaster",
}
FIXED_TIME = (2020, 1, 1, 0, 0, 0)


def zip_directory(folder: Path) -> bytes:
    folder = folder.resolve()
    if not folder.is_dir():
        raise NotADirectoryError(f"working_dir {folder} is not a folder")
    paths = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not Path(root, d).is_symlink())
        for name in sorted(files):
            path = Path(root, name)
            if path.is_symlink() or not path.is_file() or name.endswith(".pyc"):
                continue
            paths.append(path.relative_to(folder).as_posix())
    return zip_files(folder, paths)


def zip_files(folder: Path, relative_paths: Iterable[str]) -> bytes:
    """The files `relative_paths` (posix, relative to `folder`), in the order given, in a zip that
    depends on nothing but their names, contents and executable bits (every member has one fixed time)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in relative_paths:
            path = folder / name
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.external_attr = (0o100755 if os.access(path, os.X_OK) else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()
