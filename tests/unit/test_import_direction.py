"""Imports point one way: `api` -> `trainmaster`, `workers` -> `trainmaster`, never back.

Every import statement counts, those inside functions included, so a lazy import cannot hide a
dependency. `trainmaster` (the SDK users install alone) must load no server or training library.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "trainmaster": {"api", "workers"},
    "workers": {"api"},
    "api": {"workers"},
}
SERVER_LIBRARIES = ("fastapi", "sqlalchemy", "psycopg", "alembic", "uvicorn", "ray", "torch", "api", "workers")


def imported_packages(path: Path) -> set[tuple[int, str]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, alias.name.split(".")[0]) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.lineno, node.module.split(".")[0]))
    return found


def violations(package: str) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for path in sorted((REPO / package).rglob("*.py"))
        for line, target in sorted(imported_packages(path))
        if target in FORBIDDEN[package]
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    assert violations(package) == []


def test_the_walker_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from api.db import models\n    import workers.driver\n")
    assert {target for _, target in imported_packages(module)} == {"api", "workers"}


@pytest.mark.parametrize("module", ["trainmaster", "trainmaster.cli.main"])
def test_the_sdk_and_its_cli_load_no_server_library(module: str) -> None:
    listed = f"sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_LIBRARIES!r})"
    code = f"import sys, {module}; print(' '.join({listed}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    allowed = {"api", "api.cli"}  # the CLI finds the server verbs through an entry point; they load lazily
    assert set(loaded.stdout.split()) - (allowed if module.endswith("cli.main") else set()) == set()
