"""docs/security.md names real things: every TRAINMASTER_* variable is a setting or is read somewhere,
every file or folder it points at exists, and the README links it. A rename that leaves the threat
model describing something that is gone fails here."""

from __future__ import annotations

import re
from pathlib import Path

from api.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "security.md").read_text()
SOURCES = ("api", "workers", "trainmaster", "platform")


def source_text() -> str:
    files = [path for top in SOURCES for path in (REPO / top).rglob("*") if path.is_file()]
    files.append(REPO / "docker-compose.yml")
    return "\n".join(path.read_text(errors="ignore") for path in files if path.suffix != ".pyc")


def test_every_variable_named_is_a_setting_or_read_by_the_code() -> None:
    named = set(re.findall(r"\bTRAINMASTER_[A-Z0-9_]*[A-Z0-9]\b", DOC))
    assert named, "the doc names no setting"
    fields = {f"TRAINMASTER_{name.upper()}" for name in Settings.model_fields}
    code = source_text()
    unknown = sorted(name for name in named - fields if name not in code)
    assert not unknown, f"docs/security.md names variables nothing defines or reads: {unknown}"


def test_every_path_named_exists() -> None:
    roots = "api|workers|trainmaster|platform|tests|migrations|docs"
    paths = set(re.findall(rf"`((?:{roots})/[\w./-]*|docker-compose\.yml)`", DOC))
    assert paths, "the doc names no file"
    missing = sorted(path for path in paths if not (REPO / path).exists())
    assert not missing, f"docs/security.md points at paths that do not exist: {missing}"


def test_the_readme_links_it() -> None:
    assert "(docs/security.md)" in (REPO / "README.md").read_text()
