"""`trainmaster up` starts Ray from the user's shell: the Ray nodes (and so every job on them) get that
shell's environment less the platform's secrets; the API and the dispatcher keep the shell's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.stack import local, ray_head

SHELL = {
    "HOME": "/home/me",
    "TRAINMASTER_DATABASE_URL": "postgresql://postgres:pw@db/trainmaster",
    "TRAINMASTER_TEST_DATABASE_URL": "postgresql://postgres@127.0.0.1/postgres",
    "TRAINMASTER_TOKEN": "tm_admin",
    "TRAINMASTER_JOB_TOKEN": "tm_job",
    "MY_DB": "postgres://u:p@h/d",
    "TRAINMASTER_WARM_DIR": "/srv/warm",
    "TRAINMASTER_RETENTION_DAYS": "30",
    "RAY_ADDRESS": "http://elsewhere:8265",
}


def test_ray_processes_get_the_shell_less_the_platforms_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SHELL.items():
        monkeypatch.setenv(name, value)
    env = ray_head.ray_env(Path("/tmp/token"))
    for secret in (
        "TRAINMASTER_DATABASE_URL",
        "TRAINMASTER_TEST_DATABASE_URL",
        "TRAINMASTER_TOKEN",
        "TRAINMASTER_JOB_TOKEN",
        "MY_DB",
        "RAY_ADDRESS",
    ):
        assert secret not in env, secret
    assert env["HOME"] == "/home/me" and env["TRAINMASTER_WARM_DIR"] == "/srv/warm"
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/tmp/token"


def test_the_api_and_dispatcher_keep_the_shells_settings_and_get_the_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SHELL.items():
        monkeypatch.setenv(name, value)
    state = local.StackState(
        home="/h",
        database_url="postgresql://stack",
        embedded_postgres=True,
        ray_dashboard="http://127.0.0.1:8265",
        ray_gcs="127.0.0.1:6379",
        api_url="http://127.0.0.1:8000",
    )
    env = local.server_env(state)
    assert env["TRAINMASTER_DATABASE_URL"] == "postgresql://stack" and env["TRAINMASTER_RETENTION_DAYS"] == "30"
    assert "RAY_ADDRESS" not in env and env["RAY_AUTH_MODE"] == "token"


@pytest.mark.parametrize(
    ("failures", "outcome"),
    [
        (["timed out during startup"], "joined"),
        (["timed out during startup"] * ray_head.JOIN_TRIES, "timed out during startup"),
        (["Ray version mismatch"], "Ray version mismatch"),
    ],
)
def test_a_join_whose_raylet_was_slow_to_register_is_stopped_and_tried_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failures: list[str], outcome: str
) -> None:
    """Ray's `ray start` waits a fixed 30 s for the new raylet; under load it gives up while the node
    is still starting. Only that failure is retried, each time after stopping what it left."""
    runs: list[list[str]] = []
    stopped: list[Path] = []

    def run(command: list[str], env: dict[str, str], log_path: Path | None, what: str, user: object) -> None:
        runs.append(command)
        if len(runs) <= len(failures):
            raise RuntimeError(f"{what} failed: Exception: {failures[len(runs) - 1]}")

    monkeypatch.setattr(ray_head, "_run", run)
    monkeypatch.setattr(ray_head, "stop", lambda temp_dir, *_: stopped.append(temp_dir))
    node = tmp_path / "node"

    def join() -> str:
        ray_head.join("127.0.0.1:6379", tmp_path / "token", node, num_cpus=1)
        return "joined"

    if outcome == "joined":
        assert join() == "joined"
        assert len(runs) == 2 and runs[0] == runs[1] and stopped == [node]
    else:
        with pytest.raises(RuntimeError, match=outcome):
            join()
        retried = outcome.startswith("timed out")
        assert len(runs) == (ray_head.JOIN_TRIES if retried else 1)
        assert stopped == [node] * (len(runs) - 1)


def test_node_labels_are_parsed_and_given_to_ray_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert ray_head.parse_labels("rack=r1, block=b2") == {"rack": "r1", "block": "b2"}
    for bad in ("rack", "=r1", "rack=", "rack=r1,zone"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            ray_head.parse_labels(bad)
    commands: list[list[str]] = []
    monkeypatch.setattr(ray_head, "_run", lambda command, *args: commands.append(command))
    ray_head.join("127.0.0.1:6379", tmp_path / "token", tmp_path / "ray", labels={"rack": "r1", "block": "b2"})
    assert "--labels=rack=r1,block=b2" in commands[0]
    with pytest.raises(ValueError, match="2 sets of node labels for 1 node"):
        local.up(nodes=1, node_labels=[{"rack": "a"}, {"rack": "b"}])  # refused before anything starts
