"""HEAD /v1/code/{digest}: what `trainmaster run` asks before uploading a folder it packed."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.factories.http import bearer
from trainmaster.cli.run import upload_unless_stored
from trainmaster.packing import pack


def test_head_answers_whether_this_project_holds_the_package(
    http: TestClient, auth: dict[str, str], other_token: str, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    package = pack(tmp_path)
    path = f"/v1/code/{package.digest}"
    assert http.head(path, headers=auth).status_code == 404
    uploaded = http.post("/v1/code", content=package.content, headers={**auth, "Content-Type": "application/zip"})
    assert uploaded.json()["id"] == package.digest, "the CLI's digest must be the API's id"
    assert http.head(path, headers=auth).status_code == 200
    assert http.head(path, headers=bearer(other_token)).status_code == 404
    assert http.head(path).status_code == 401
    assert http.head("/v1/code/not-a-digest", headers=auth).status_code == 404


def test_upload_unless_stored_sends_a_package_once(http: TestClient, token: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    package = pack(tmp_path)
    sent = [upload_unless_stored(package, "http://testserver", token, transport=http._transport) for _ in range(2)]
    assert sent == [True, False]
