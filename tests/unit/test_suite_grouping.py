"""The suite's grouping works (tests/conftest.py, scripts/test: -n 2 --dist loadgroup): every test of a
file, and every CPU_BOUND file, runs on one worker. pytest-xdist's loadgroup has broken silently before
(pytest 9.2's node ids: no test was grouped, each file's module fixtures started on both workers, and
the heavy files ran two at once): this runs it on a small suite and fails then."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = """
import os
from pathlib import Path

import pytest


@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    Path(os.environ["OUT"], f"{name}-{{i}}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_a_group_runs_whole_on_one_worker(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(TESTS.format(name=name))
    out = tmp_path / "out"
    out.mkdir()
    argv = ["-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=tmp_path,
        env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {path.name: path.read_text() for path in out.iterdir()}
    assert len(workers) == 12 and len(set(workers.values())) == 1, workers  # 12 tests, one group, one worker
