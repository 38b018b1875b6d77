from __future__ import annotations

import io
import stat
import struct
import warnings
import zipfile
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

import trainmaster as tm
from api.app import create_app
from api.code_packages import archive
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.code import make_zip, upload
from tests.factories.jobs import spec


def stored(database_url: str) -> int:
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM code_packages").fetchone()
        assert row is not None
        return int(row[0])


def test_upload_is_content_addressed_and_usable_by_a_job(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    content = make_zip({"train.py": b"print('hi')\n", "pkg/__init__.py": b""})
    first = upload(http, auth, content)
    assert first.status_code == 201, first.text
    body = first.json()
    assert body["id"].startswith("sha256:") and body["size"] == len(content) and body["file_count"] == 2
    assert upload(http, auth, content).json()["id"] == body["id"]
    assert stored(database_url) == 1
    job = http.post("/v1/jobs", json=spec(entrypoint="script:train.py", code=body["id"]), headers=auth)
    assert job.status_code == 201


def test_job_with_unknown_code_is_422(http: TestClient, auth: dict[str, str]) -> None:
    response = http.post("/v1/jobs", json=spec(code="sha256:" + "0" * 64), headers=auth)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "code"]


@pytest.mark.parametrize(
    ("case", "content", "status", "words"),
    [
        ("not a zip", b"hello", 422, "not a zip"),
        ("absolute path", make_zip({"/etc/cron.d/x": b"x"}), 422, "absolute"),
        ("parent folder", make_zip({"../../escape.py": b"x"}), 422, ".."),
        ("symlink", make_zip({"a.py": b""}, link="link"), 422, "link"),
        ("too many files", make_zip({f"f{i}": b"" for i in range(5001)}), 422, "entries"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "",
)
def test_hostile_archives_are_refused(
    http: TestClient, auth: dict[str, str], database_url: str, case: str, content: bytes, status: int, words: str
) -> None:
    response = upload(http, auth, content)
    assert response.status_code == status, response.text
    assert words in str(response.json()["detail"])
    assert stored(database_url) == 0


def zip_of(*members: tuple[str, bytes], method: int = zipfile.ZIP_STORED, mode: int | None = None) -> bytes:
    """An archive with these members in this order (duplicates allowed), each optionally of a file type."""
    buffer = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w", compression=method) as zf:
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name, and writes it anyway
        for name, data in members:
            info = zipfile.ZipInfo(name)
            info.compress_type = method
            if mode is not None:
                info.external_attr = mode << 16
            zf.writestr(info, data)
    return buffer.getvalue()


def central_entry(content: bytes, name: str) -> int:
    """Where the central directory's record of member `name` starts (zipfile reads sizes and flags there)."""
    at = content.index(b"PK\x01\x02")
    while True:
        name_length = struct.unpack_from("<H", content, at + 28)[0]
        if content[at + 46 : at + 46 + name_length] == name.encode():
            return at
        at = content.index(b"PK\x01\x02", at + 4)


def data_offset(content: bytes, name: str) -> int:
    """Where member `name`'s (compressed) data starts, after its local header."""
    info = zipfile.ZipFile(io.BytesIO(content)).getinfo(name)
    name_length, extra_length = struct.unpack_from("<HH", content, info.header_offset + 26)
    return info.header_offset + 30 + name_length + extra_length


def bad_crc() -> bytes:
    content = bytearray(zip_of(("ok.py", b"fine\n"), ("train.py", b"print('the payload')\n")))
    content[data_offset(bytes(content), "train.py")] ^= 0xFF
    return bytes(content)


def bad_deflate_stream() -> bytes:
    content = bytearray(zip_of(("train.py", b"x = 1\n" * 200), method=zipfile.ZIP_DEFLATED))
    content[data_offset(bytes(content), "train.py")] = 0xFF  # block type 3 does not exist
    return bytes(content)


def truncated_member() -> bytes:
    """The directory says the compressed data is 4 bytes long: the stream stops before its end."""
    content = bytearray(zip_of(("train.py", b"x = 1\n" * 200), method=zipfile.ZIP_DEFLATED))
    struct.pack_into("<I", content, central_entry(bytes(content), "train.py") + 20, 4)
    return bytes(content)


def encrypted_member() -> bytes:
    content = bytearray(zip_of(("secret.py", b"x = 1\n")))
    at = central_entry(bytes(content), "secret.py") + 8
    struct.pack_into("<H", content, at, struct.unpack_from("<H", content, at)[0] | 0x1)
    return bytes(content)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (bad_crc(), ["'train.py'", "CRC"]),
        (bad_deflate_stream(), ["'train.py'", "damaged", "invalid block type"]),
        (truncated_member(), ["'train.py'", "damaged", "CRC"]),  # zlib stops where the data stops
        (encrypted_member(), ["'secret.py'", "encrypted"]),
        (zip_of(("train.py", b"1"), ("train.py", b"2")), ["'train.py'", "duplicate"]),
        (zip_of(("a/b.py", b"1"), ("a/./b.py", b"2")), ["'a/./b.py'", "duplicate", "'a/b.py'"]),
        (zip_of(("a/", b""), ("./a//", b"")), ["'./a//'", "duplicate"]),
        (zip_of(("a", b"file"), ("a/b.py", b"")), ["'a/b.py'", "also a file"]),
        (zip_of(("a/b.py", b""), ("a", b"file")), ["'a'", "file and also a folder"]),
        (zip_of(("a", b"file"), ("a/", b"")), ["'a/'", "also a file"]),
        (zip_of(("link", b"/etc/passwd"), mode=stat.S_IFLNK | 0o777), ["'link'", "link"]),
        (zip_of(("pipe", b""), mode=stat.S_IFIFO | 0o644), ["'pipe'", "special file"]),
        (zip_of(("a/../../escape.py", b"")), ["'a/../../escape.py'", ".."]),
        (zip_of(("a\\b.py", b"")), ["'a\\\\b.py'", "plain relative path"]),
        (zip_of(("C:/windows/x.py", b"")), ["'C:/windows/x.py'", "absolute"]),
        (zip_of(("x" * 300, b"")), ["too long"]),
    ],
    ids=[
        "bad-crc",
        "bad-deflate",
        "truncated",
        "encrypted",
        "duplicate",
        "duplicate-normalised",
        "duplicate-folder",
        "file-then-folder",
        "folder-then-file",
        "file-and-named-folder",
        "symlink",
        "fifo",
        "dotdot",
        "backslash",
        "drive-letter",
        "long-name",
    ],
)
def test_damaged_and_ambiguous_archives_are_refused_naming_the_member(
    http: TestClient, auth: dict[str, str], database_url: str, content: bytes, words: list[str]
) -> None:
    response = upload(http, auth, content)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["body"]
    for word in words:
        assert word in detail[0]["msg"], (word, detail)
    assert stored(database_url) == 0


def test_folder_entries_and_dot_prefixes_are_accepted(http: TestClient, auth: dict[str, str]) -> None:
    """What real archivers write: `./` prefixes, folder entries before or after their files, the root."""
    content = zip_of(("./", b""), ("./pkg/mod.py", b""), ("pkg/", b""), ("train.py", b"print(1)\n"))
    response = upload(http, auth, content)
    assert response.status_code == 201, response.text
    assert response.json()["file_count"] == 2


def test_member_count_limit_names_the_limit(settings: Settings, auth: dict[str, str]) -> None:
    with TestClient(create_app(settings.model_copy(update={"max_code_files": 3}))) as http:
        response = upload(http, auth, zip_of(*((f"f{i}.py", b"") for i in range(4))))
    assert response.status_code == 422 and "holds 4 entries; the limit is 3" in str(response.json()["detail"])


def test_zip_bomb_is_413(settings: Settings, auth: dict[str, str], database_url: str) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("bomb", b"\0" * (8 * 1024 * 1024))  # 8 MiB of zeros, about 8 KiB compressed
    assert len(buffer.getvalue()) < 64 * 1024
    small = settings.model_copy(update={"max_code_unpacked_bytes": 4 * 1024 * 1024})
    with TestClient(create_app(small)) as http:
        response = upload(http, auth, buffer.getvalue())
    assert response.status_code == 413 and "unpacks" in response.json()["detail"]
    assert stored(database_url) == 0


def test_wrong_content_type_is_415(http: TestClient, auth: dict[str, str]) -> None:
    assert upload(http, auth, make_zip({"a": b""}), "text/plain").status_code == 415


def test_extract_writes_only_inside_the_destination(tmp_path: Path) -> None:
    content = make_zip({"train.py": b"x = 1\n", "sub/mod.py": b""})
    target = archive.extract(content, tmp_path / "out", max_files=10, max_unpacked_bytes=1000)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        "sub/mod.py",
        "train.py",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left behind


def test_sdk_uploads_a_working_dir_reproducibly(sdk: tm.Client, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / "__pycache__").mkdir()
    first = sdk.upload_code(tmp_path)
    assert first.file_count == 1
    assert sdk.upload_code(tmp_path).id == first.id
    job = sdk.submit(name="with-code", entrypoint="script:train.py", working_dir=tmp_path)
    assert job.info.spec["code"] == first.id
