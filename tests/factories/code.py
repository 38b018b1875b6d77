"""Code packages: a zip made in memory (a symlink member if asked), and its upload."""

from __future__ import annotations

import io
import stat
import zipfile
from typing import Any

from fastapi.testclient import TestClient


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


def upload(http: TestClient, auth: dict[str, str], content: bytes, content_type: str = "application/zip") -> Any:
    return http.post("/v1/code", content=content, headers={**auth, "Content-Type": content_type})
