"""JobSpec.framework and the pieces of workers/frameworks/ that need no Ray cluster."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from pydantic import ValidationError

from trainmaster.models import Framework, JobSpec
from workers import frameworks
from workers.frameworks import mpi, paddle


def test_framework_defaults_to_torch_and_old_specs_still_load() -> None:
    assert JobSpec(name="a", entrypoint="builtin:mlp").framework is Framework.torch
    assert JobSpec.model_validate_json('{"name": "a", "entrypoint": "script:t.py"}').framework is Framework.torch


def test_unknown_framework_names_the_field() -> None:
    with pytest.raises(ValidationError) as raised:
        JobSpec(name="a", entrypoint="script:t.py", framework="keras")  # type: ignore[arg-type]
    assert raised.value.errors()[0]["loc"] == ("framework",)


@pytest.mark.parametrize(
    ("framework", "entrypoint", "says"),
    [
        ("tensorflow", "builtin:mlp", "built-in templates are PyTorch code"),
        ("mpi", "train:main", "entrypoint must be 'script:"),
        ("horovod", "train:main", "entrypoint must be 'script:"),
    ],
)
def test_entrypoint_must_fit_the_framework(framework: str, entrypoint: str, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        JobSpec(name="a", entrypoint=entrypoint, framework=framework)  # type: ignore[arg-type]


def test_every_framework_has_a_module_with_the_same_names() -> None:
    for framework in Framework:
        found = frameworks.module(framework)
        for name in ("PACKAGE", "INSTALL", "trainer", "prepare", "runtime", "run_script"):
            assert hasattr(found, name), (framework, name)


def test_a_missing_package_fails_at_once_with_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("workers.frameworks.paddle")
    fake.PACKAGE = "paddle_that_is_not_installed"  # type: ignore[attr-defined]
    fake.INSTALL = "pip install 'trainmaster[paddle]'"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "workers.frameworks.paddle", fake)
    with pytest.raises(frameworks.FrameworkMissing) as raised:
        frameworks.require("paddle")
    message = str(raised.value)
    assert "'paddle_that_is_not_installed'" in message and "pip install 'trainmaster[paddle]'" in message
    assert isinstance(raised.value, frameworks.EntrypointError)  # the driver's exit 2, not a retry loop


def test_hostfile_has_one_line_per_node_in_rank_order() -> None:
    assert mpi.hostfile_lines(["10.0.0.2", "10.0.0.2", "10.0.0.1", "10.0.0.2"]) == [
        "10.0.0.2 slots=3",
        "10.0.0.1 slots=1",
    ]


def test_the_first_rank_on_each_other_node_starts_mpiruns_daemon_there() -> None:
    assert mpi.remote_servers(["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.2"]) == {
        "10.0.0.2": 2,
        "10.0.0.3": 3,
    }
    assert mpi.remote_servers(["10.0.0.1", "10.0.0.1"]) == {}  # one node: mpirun starts every rank itself


def test_mpirun_forwards_the_named_variables() -> None:
    command = mpi.mpirun_command(Path("/h"), 4, ["TRAINMASTER_JOB_ID"], ["python", "t.py"])
    assert command[:5] == ["mpirun", "--hostfile", "/h", "-np", "4"]
    assert command[command.index("-x") + 1] == "TRAINMASTER_JOB_ID" and command[-2:] == ["python", "t.py"]
    assert "plm_rsh_agent" not in command
    agent = mpi.mpirun_command(Path("/h"), 4, [], ["t"], ["python", "mpi_agent.py", "/spec.json"])
    assert agent[agent.index("plm_rsh_agent") + 1] == "python mpi_agent.py /spec.json"


def test_paddle_gets_the_launchers_collective_environment() -> None:
    env = paddle.collective_env([("10.0.0.1", 7000), ("10.0.0.2", 7001)], 1, 0, 1, "10.0.0.1:6000", use_gpu=False)
    assert env["PADDLE_TRAINER_ID"] == "1" and env["PADDLE_TRAINERS_NUM"] == "2"
    assert env["PADDLE_TRAINER_ENDPOINTS"] == "10.0.0.1:7000,10.0.0.2:7001"
    assert env["PADDLE_CURRENT_ENDPOINT"] == "10.0.0.2:7001" and env["PADDLE_MASTER"] == "10.0.0.1:6000"
    assert env["PADDLE_NNODES"] == "2" and env["PADDLE_DISTRI_BACKEND"] == "gloo"
