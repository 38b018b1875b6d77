from __future__ import annotations

import io
import stat
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
from tests.factories.jobs import spec


def make_zip(entries: dict[str, bytes], *, link: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return buffer.getvalue()


def upload(http: TestClient, auth: dict[str, str], content: bytes, content_type: str = "application/zip"):
    return http.post("/v1/code", content=content, headers={**auth, "Content-Type": content_type})


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
