"""The SDK ships what `trainmaster run` ships: `submit(working_dir=...)` and `upload_code`, sync and
async, upload the very zip `trainmaster.packing.pack` makes of the folder (git's ignore rules, no
secrets, no .git unless asked), driven through the real clients against a recording transport."""

from __future__ import annotations

import asyncio
import io
import json
import warnings
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

import trainmaster as tm
from trainmaster.packing import PackageWarning, pack

FILES = {
    "train.py": "print('train')\n",
    "pkg/__init__.py": "",
    ".gitignore": "outputs/\n*.log\n",
    "outputs/model.pt": "weights",
    "run.log": "noise",
    ".env": "AWS_SECRET_ACCESS_KEY=hunter2\n",
    "keys/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
    ".git/HEAD": "ref: refs/heads/main\n",
}


def folder(root: Path) -> Path:
    for name, content in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


class Api:
    """Answers the calls a submit makes (HEAD and POST /v1/code, POST /v1/jobs); keeps each upload."""

    def __init__(self) -> None:
        self.uploads: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "HEAD":
            return httpx.Response(404)
        body = request.read()
        if request.url.path == "/v1/code":
            self.uploads.append(body)
            names = zipfile.ZipFile(io.BytesIO(body)).namelist()
            return httpx.Response(201, json={"id": "sha256:" + "0" * 64, "size": len(body), "file_count": len(names)})
        spec: dict[str, Any] = json.loads(body)
        now = datetime.now(UTC).isoformat()
        job = {"id": "j1", "project": "p", "name": spec["name"], "status": "queued", "spec": spec, "created_at": now}
        return httpx.Response(201, json=job)


def members(content: bytes) -> set[str]:
    return set(zipfile.ZipFile(io.BytesIO(content)).namelist())


def submitted(work: Path, **options: bool) -> bytes:
    api = Api()
    with tm.Client("http://tm", "tm_x", transport=httpx.MockTransport(api)) as client:
        client.submit(name="a", entrypoint="script:train.py", working_dir=work, **options)
    [content] = api.uploads
    return content


def submitted_async(work: Path, **options: bool) -> bytes:
    api = Api()

    async def scenario() -> None:
        async with tm.AsyncClient("http://tm", "tm_x", transport=httpx.MockTransport(api)) as client:
            await client.submit(name="a", entrypoint="script:train.py", working_dir=work, **options)
            await client.upload_code(work, **options)

    asyncio.run(scenario())
    first, again = api.uploads
    assert first == again
    return first


def test_submit_ships_exactly_what_trainmaster_run_ships(tmp_path: Path) -> None:
    work = folder(tmp_path)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        content = submitted(work)
    assert members(content) == {".gitignore", "pkg/__init__.py", "train.py"}
    assert content == pack(work).content
    [secrets] = [w for w in warned if issubclass(w.category, PackageWarning)]
    assert ".env" in str(secrets.message) and "keys/id_rsa" in str(secrets.message)
    assert "include_secrets=True" in str(secrets.message)
    with pytest.warns(PackageWarning):
        assert submitted_async(work) == content
    api = Api()
    with tm.Client("http://tm", "tm_x", transport=httpx.MockTransport(api)) as client, pytest.warns(PackageWarning):
        client.upload_code(work)
    assert api.uploads == [content]


def test_secrets_and_git_ship_only_when_asked(tmp_path: Path) -> None:
    work = folder(tmp_path)
    asked = submitted(work, include_secrets=True, include_git=True)
    assert asked == pack(work, include_secrets=True, include_git=True).content
    assert members(asked) == {".gitignore", "pkg/__init__.py", "train.py", ".env", "keys/id_rsa", ".git/HEAD"}
    assert submitted_async(work, include_secrets=True) == pack(work, include_secrets=True).content
