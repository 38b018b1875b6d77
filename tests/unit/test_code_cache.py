"""The dispatcher's code cache (archive.unpacked): one folder per archive digest, unpacked once,
whoever asks at the same time; a package that can never be unpacked raises BadPackage, the host's
own faults stay OSError."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import zipfile
from pathlib import Path
from typing import Any

import pytest

from api.code_packages import archive
from api.code_packages.archive import BadPackage, unpacked

LIMITS = {"max_files": 100, "max_unpacked_bytes": 64 * 1024 * 1024}


def make_zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def digest(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_unpacks_once_into_the_digest_folder(tmp_path: Path) -> None:
    content = make_zip({"train.py": b"x = 1\n", "pkg/mod.py": b"y = 2\n"})
    folder = unpacked(tmp_path, digest(content), content, **LIMITS)
    assert folder == tmp_path / hashlib.sha256(content).hexdigest()
    assert files(folder) == {"train.py": b"x = 1\n", "pkg/mod.py": b"y = 2\n"}
    inode = folder.stat().st_ino
    assert unpacked(tmp_path, digest(content).removeprefix("sha256:"), content, **LIMITS) == folder
    assert folder.stat().st_ino == inode  # as it was: not unpacked again
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no staging folder left


@pytest.mark.parametrize(
    "alter",
    [
        lambda folder: (folder / "train.py").write_bytes(b"import os; os.system('steal')\n"),
        lambda folder: (folder / "sitecustomize.py").write_bytes(b"print('planted')\n"),
        lambda folder: (folder / "pkg" / "mod.py").unlink(),
        lambda folder: (folder / "train.py").chmod(0o755),
        lambda folder: (folder / "pkg" / "link.py").symlink_to("/etc/passwd"),
    ],
    ids=["changed", "added", "removed", "made executable", "linked"],
)
def test_a_folder_altered_on_disk_is_found_and_unpacked_again(tmp_path: Path, alter: Any) -> None:
    """A host whose cache jobs can reach (one uid for everything, a shared volume): what launches is
    the package's content, never what was left in its folder."""
    content = make_zip({"train.py": b"x = 1\n", "pkg/mod.py": b"y = 2\n"})
    folder = unpacked(tmp_path, digest(content), content, **LIMITS)
    expected = archive.members_digest(content, **LIMITS)
    assert archive.tree_digest(folder) == expected
    alter(folder)
    assert archive.tree_digest(folder) != expected
    assert unpacked(tmp_path, digest(content), content, **LIMITS) == folder
    assert files(folder) == {"train.py": b"x = 1\n", "pkg/mod.py": b"y = 2\n"}
    assert archive.tree_digest(folder) == expected and not (folder / "pkg" / "link.py").is_symlink()
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def _unpack_in_another_process(root: str, code: str, content: bytes, barrier: Any, results: Any) -> None:
    barrier.wait()
    results.put(str(unpacked(Path(root), code, content, **LIMITS)))


def test_concurrent_processes_share_one_folder(tmp_path: Path) -> None:
    # Big enough that the unpacking overlaps: every process starts it, one rename wins.
    content = make_zip({f"part{i}.bin": bytes([i]) * (2 * 1024 * 1024) for i in range(8)})
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(3), context.Queue()
    processes = [
        context.Process(
            target=_unpack_in_another_process, args=(str(tmp_path), digest(content), content, barrier, results)
        )
        for _ in range(3)
    ]
    for process in processes:
        process.start()
    folders = {results.get(timeout=120) for _ in processes}
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    hex_digest = hashlib.sha256(content).hexdigest()
    assert folders == {str(tmp_path / hex_digest)}
    assert [p.name for p in tmp_path.iterdir()] == [hex_digest]  # the losers' staging folders are gone
    assert len(files(tmp_path / hex_digest)) == 8


def test_content_of_another_digest_is_refused(tmp_path: Path) -> None:
    content = make_zip({"train.py": b""})
    wrong = "sha256:" + "0" * 64
    with pytest.raises(BadPackage, match="another digest"):
        unpacked(tmp_path, wrong, content, **LIMITS)
    with pytest.raises(BadPackage, match="no sha256 digest"):
        unpacked(tmp_path, "sha256:../../etc", content, **LIMITS)
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_archive_is_a_bad_package(tmp_path: Path) -> None:
    content = bytearray(make_zip({"train.py": b"print('hello')\n" * 100}))
    info = zipfile.ZipFile(io.BytesIO(bytes(content))).getinfo("train.py")
    content[info.header_offset + 30 + len("train.py")] = 0xFF  # no deflate block has type 3
    code = digest(bytes(content))
    with pytest.raises(BadPackage) as raised:
        unpacked(tmp_path, code, bytes(content), **LIMITS)
    assert str(raised.value).startswith(f"code package {code} cannot be unpacked: member 'train.py': damaged data")
    assert list(tmp_path.iterdir()) == []  # nothing half unpacked


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        ({"a": b"", "a/b": b""}, "also a file"),
        ({"../x": b""}, ".."),
        ({f"f{i}": b"" for i in range(101)}, "101 entries"),
        ({"big": b"\0" * (65 * 1024 * 1024)}, "unpacks to more than"),
    ],
    ids=["file-and-folder", "dotdot", "too-many", "too-big"],
)
def test_archives_the_upload_refuses_are_bad_packages(tmp_path: Path, entries: dict[str, bytes], words: str) -> None:
    content = make_zip(entries)
    with pytest.raises(BadPackage, match=words):
        unpacked(tmp_path, digest(content), content, **LIMITS)


def test_a_host_fault_stays_an_os_error(tmp_path: Path) -> None:
    content = make_zip({"train.py": b""})
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache should be")
    with pytest.raises(OSError) as raised:
        unpacked(not_a_folder, digest(content), content, **LIMITS)
    assert not isinstance(raised.value, BadPackage)


def test_discard_removes_the_folder(tmp_path: Path) -> None:
    content = make_zip({"train.py": b""})
    folder = unpacked(tmp_path, digest(content), content, **LIMITS)
    archive.discard(tmp_path, digest(content))
    assert not folder.exists() and list(tmp_path.iterdir()) == []
    archive.discard(tmp_path, digest(content))  # already gone: nothing to do
