"""What `trainmaster run` ships: the current folder as git would see it, never its secrets.

Rules, in order, for every file and folder under the working folder:

1. Symbolic links, `*.pyc` and the folders `SKIP_DIRS` names (virtualenvs, caches,
   `node_modules`, `.git` …) are left out; `.git` goes in with `include_git`.
2. `.gitignore` and `.trainmasterignore` files, in any folder, with git's syntax and precedence: a file's
   patterns apply below its own folder, a deeper file overrides a shallower one, `.trainmasterignore`
   overrides the `.gitignore` beside it (so `!data/small.csv` there ships a file git ignores). A folder
   left out is not entered, so its files cannot come back (as in git).
3. What looks like a secret is left out, whatever the ignore files say: `.env`, `.env.*`, `.envrc`,
   private keys (`*.pem`, `*.key`, `id_rsa*`, `id_dsa*`, `id_ecdsa*`, `id_ed25519*`). `include_secrets`
   lifts this rule only (an ignored `.env` still needs `!.env` in `.trainmasterignore`).

The zip is reproducible (`zip_files`), so the same files give the same `sha256:` id and an
unchanged folder is not uploaded twice.

This is the one packer: `trainmaster run`, `Client.upload_code` / `submit(working_dir=...)` and their
`AsyncClient` twins all ship what `pack` selects, so the SDK never ships what the CLI keeps back.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

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
IGNORE_FILES = (".gitignore", ".trainmasterignore")
SECRET_PATTERNS = (
    ".env",
    ".env.*",
    ".envrc",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
)
WARN_BYTES = 20 * 1024 * 1024  # above this a package is worth a look: data or checkpoints that slipped in
WARN_FILES = 2000  # the API takes 5,000 by default
LARGEST_SHOWN = 3


def is_secret(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_PATTERNS)


@dataclass
class _Rules:
    """The ignore files met on the way down: (folder relative to the root, its spec), shallowest first."""

    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = field(default_factory=list)

    def below(self, folder: Path, relative: str) -> _Rules:
        added = []
        for name in IGNORE_FILES:
            path = folder / name
            if path.is_file() and not path.is_symlink():
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
                added.append((relative, pathspec.GitIgnoreSpec.from_lines(lines)))
        return _Rules(self.specs + added) if added else self

    def ignores(self, relative: str, *, is_dir: bool) -> bool:
        ignored = False
        for base, spec in self.specs:
            inside = relative[len(base) + 1 :] if base else relative
            verdict = spec.check_file(inside + "/" if is_dir else inside).include
            if verdict is not None:
                ignored = verdict
        return ignored


@dataclass(frozen=True)
class Selection:
    files: list[str]  # posix paths relative to the folder, in walk order (folders sorted)
    secrets: list[str]  # left out by rule 3
    sizes: dict[str, int]


def select(folder: Path, *, include_git: bool = False, include_secrets: bool = False) -> Selection:
    """The files of `folder` that the rules above let through, and the secrets they kept back."""
    folder = folder.resolve()
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder")
    skipped_dirs = SKIP_DIRS - {".git"} if include_git else SKIP_DIRS
    files: list[str] = []
    secrets: list[str] = []
    sizes: dict[str, int] = {}

    def walk(path: Path, relative: str, rules: _Rules) -> None:
        rules = rules.below(path, relative)
        entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        subfolders = []
        for entry in entries:
            name = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_symlink():
                continue
            if entry.is_dir():
                if entry.name not in skipped_dirs and not rules.ignores(name, is_dir=True):
                    subfolders.append((Path(entry.path), name))
            elif entry.is_file() and not entry.name.endswith(".pyc") and not rules.ignores(name, is_dir=False):
                if is_secret(entry.name) and not include_secrets:
                    secrets.append(name)
                else:
                    files.append(name)
                    sizes[name] = entry.stat().st_size
        for subfolder, name in subfolders:
            walk(subfolder, name, rules)

    walk(folder, "", _Rules())
    return Selection(files=files, secrets=secrets, sizes=sizes)


@dataclass(frozen=True)
class Package:
    folder: Path
    selection: Selection
    content: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.content).hexdigest()

    @property
    def files(self) -> list[str]:
        return self.selection.files

    @property
    def file_bytes(self) -> int:
        return sum(self.selection.sizes.values())

    def warnings(self, *, secrets_option: str = "--include-secrets") -> list[str]:
        """What a person should see before shipping: secrets kept back (and the option, `secrets_option`,
        that ships them), a package larger than code is."""
        found = []
        if self.selection.secrets:
            found.append(f"not shipped (secrets): {', '.join(self.selection.secrets)}; {secrets_option} ships them")
        if self.file_bytes > WARN_BYTES or len(self.files) > WARN_FILES:
            largest = sorted(self.selection.sizes.items(), key=lambda item: -item[1])[:LARGEST_SHOWN]
            shown = ", ".join(f"{name} ({human_bytes(size)})" for name, size in largest)
            found.append(
                f"shipping {human_bytes(self.file_bytes)} in {len(self.files):,} files (largest: {shown}); "
                "list data, checkpoints and outputs the job does not need in .trainmasterignore"
            )
        return found


def pack(folder: Path, *, include_git: bool = False, include_secrets: bool = False) -> Package:
    folder = folder.resolve()
    selection = select(folder, include_git=include_git, include_secrets=include_secrets)
    return Package(folder=folder, selection=selection, content=zip_files(folder, selection.files))


class PackageWarning(UserWarning):
    """What the SDK's packing warns of (`Package.warnings`): secrets kept back, a large package."""


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


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
