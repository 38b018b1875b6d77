"""Imports point one way: `api` -> `trainmaster`, `workers` -> `trainmaster`, never back, and no two
modules of a package import each other, directly or through others.

Every import statement counts, those inside functions and under `if TYPE_CHECKING:` included, so a
lazy import cannot hide a dependency. `trainmaster` (the SDK users install alone) must load no server
or training library.
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


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str) -> set[str]:
    """Every dotted name an import statement of the module `name` (at `path`) may load, relative
    imports resolved: `from a.b import c` names `a.b` and `a.b.c` (c may be a module or a name)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def import_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    """Module -> the modules of the same packages it imports. An import of a module's own parent
    package is left out: loading a submodule runs its package's __init__ first anyway."""
    paths = {module_name(path, root): path for package in packages for path in (root / package).rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {
            target
            for name in imported_modules(path, module)
            if (target := known(name)) and target != module and not module.startswith(f"{target}.")
        }
        for module, path in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycles(import_graph(REPO, sorted(FORBIDDEN))) == []


def test_a_cycle_is_found_however_it_is_imported(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg import helpers\n")  # the parent: not an edge
    (pkg / "service.py").write_text("from pkg.sub import steps\nfrom pkg import helpers\n")
    (pkg / "sub" / "steps.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..service import Service\n"
    )
    (pkg / "helpers.py").write_text("def f():\n    import pkg.lazy\n")
    (pkg / "lazy.py").write_text("from . import helpers\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.sub"] == {"pkg.helpers"}
    assert cycles(graph) == [["pkg.helpers", "pkg.lazy"], ["pkg.service", "pkg.sub.steps"]]
    (pkg / "lazy.py").write_text("")
    (pkg / "sub" / "steps.py").write_text("")
    assert cycles(import_graph(tmp_path, ["pkg"])) == []


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
