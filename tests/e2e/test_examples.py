"""Every example in examples/, run as a person would, against the session's stack."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO, Stack

pytestmark = pytest.mark.ray


def run(command: list[str], stack: Stack | None = None, timeout: float = 600) -> str:
    env = dict(os.environ)
    if stack is not None:
        env.update({"TRAINMASTER_API_URL": stack.api.url, "TRAINMASTER_TOKEN": stack.api.token})
    for name in ("TRAINMASTER_JOB_ID", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_plain_script_runs_alone() -> None:
    out = run([sys.executable, "examples/script_mode/train.py", "--epochs", "1"])
    assert "epoch 0: loss" in out and "done" in out


def test_same_script_runs_distributed_in_script_mode(stack: Stack) -> None:
    out = run([sys.executable, "examples/script_mode/submit.py"], stack)
    assert "succeeded; last loss:" in out and "None" not in out


def test_function_mode_example(stack: Stack) -> None:
    out = run([sys.executable, "examples/function_mode/submit.py"], stack)
    assert "step 8: mse" in out and out.strip().endswith("succeeded")


def test_sdk_example(stack: Stack) -> None:
    out = run([sys.executable, "examples/api/sdk.py"], stack)
    assert "succeeded:" in out and "loss points" in out


def test_curl_example(stack: Stack) -> None:
    out = run(["bash", "examples/api/curl.sh"], stack)
    assert "event: metrics" in out and out.strip().splitlines()[-1].startswith("succeeded")
