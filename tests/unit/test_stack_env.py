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
