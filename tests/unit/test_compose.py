"""docker-compose.yml, checked without a Docker engine: every command is a real CLI entry point
with valid flags, required secrets fail fast, and the Ray dashboard is never published.

tests/e2e/ starts these same commands (`trainmaster api`, `trainmaster dispatcher`, `ray start`) as
processes on loopback and runs jobs through them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import yaml

from tests.factories.commands import ray_cli, resolve
from trainmaster.cli.main import app

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def test_every_service_is_there() -> None:
    assert {"postgres", "ray-head", "ray-worker", "api", "dispatcher"} <= set(SERVICES)
    assert "healthcheck" in SERVICES["postgres"]


@pytest.mark.parametrize("service", [name for name, s in SERVICES.items() if "command" in s])
def test_commands_are_real_entry_points_with_valid_flags(service: str) -> None:
    argv = SERVICES[service]["command"]
    assert isinstance(argv, list), "commands are exec lists, not shell strings"
    program, args = argv[0], argv[1:]
    group = {"trainmaster": typer.main.get_command(app), "ray": ray_cli()}[program]
    context = resolve(group, args)
    assert (
        context.command.name
        == {
            "ray-head": "start",
            "ray-worker": "start",
            "ray-worker-gpu": "start",
            "api": "api",
            "dispatcher": "dispatcher",
            "migrate": "upgrade",
        }[service]
    )


def test_a_bad_flag_would_be_caught() -> None:
    with pytest.raises(Exception, match="No such option") as caught:
        resolve(typer.main.get_command(app), ["api", "--no-such-flag"])
    assert "UsageError" in [cls.__name__ for cls in type(caught.value).__mro__]
    with pytest.raises(click.UsageError):
        resolve(ray_cli(), ["start", "--head", "--no-such-flag"])


def test_required_secrets_fail_fast() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    for name in ("POSTGRES_PASSWORD", "TRAINMASTER_SERVICE_PASSWORD", "RAY_AUTH_TOKEN"):
        uses = re.findall(r"\$\{" + name + r"(:?[?-]?)[^}]*\}", text)
        assert uses and all(use == ":?" for use in uses), f"{name} must be ${{{name}:?...}} everywhere"


def test_ray_dashboard_is_not_published_and_api_is() -> None:
    published = {name: s.get("ports", []) for name, s in SERVICES.items()}
    assert not any("8265" in str(port) for ports in published.values() for port in ports)
    assert published["api"] == ["8000:8000"]


def test_migrations_run_as_the_owner_before_the_services_which_connect_least_privileged() -> None:
    """Only `migrate` holds the owner's URL; the api and the dispatcher wait for it to finish and connect
    as trainmaster_service, which the postgres image's init script makes a member of trainmaster_app."""
    assert SERVICES["migrate"]["command"] == ["trainmaster", "db", "upgrade"]
    assert "trainmaster:${POSTGRES_PASSWORD" in SERVICES["migrate"]["environment"]["TRAINMASTER_DATABASE_URL"]
    for name in ("api", "dispatcher"):
        assert SERVICES[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        url = SERVICES[name]["environment"]["TRAINMASTER_DATABASE_URL"]
        assert url.startswith("postgresql://trainmaster_service:") and "POSTGRES_PASSWORD" not in url
        assert "--migrate" not in SERVICES[name]["command"]
    init = [m for m in SERVICES["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in m]
    script = REPO / init[0].split(":", 1)[0]
    assert "IN ROLE trainmaster_app" in script.read_text()


def test_images_build_from_platform_docker() -> None:
    build = COMPOSE["x-trainmaster"]["build"]
    assert (REPO / build["dockerfile"]).is_file() and build["dockerfile"].startswith("platform/docker/")
    gpu = SERVICES["ray-worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


PLATFORM_SECRETS = re.compile(r"DATABASE_URL|POSTGRES_PASSWORD|TRAINMASTER_TOKEN|JOB_TOKEN|postgresql://")


def test_no_ray_node_is_given_a_platform_secret() -> None:
    """Every job on a Ray node can read that node's environment: the database URL (and any token of
    the platform) goes to the api and the dispatcher alone."""
    ray_nodes = [name for name, s in SERVICES.items() if s.get("command", [""])[0] == "ray"]
    assert {"ray-head", "ray-worker"} <= set(ray_nodes)
    for name in ray_nodes:
        environment = SERVICES[name].get("environment") or {}
        leaked = [f"{key}={value}" for key, value in environment.items() if PLATFORM_SECRETS.search(f"{key}={value}")]
        assert not leaked, f"{name} would hand every job {leaked}"
        assert environment.get("RAY_AUTH_TOKEN"), name  # it still joins with token auth
    for name in ("api", "dispatcher"):
        assert "TRAINMASTER_DATABASE_URL" in SERVICES[name]["environment"], name


def test_the_unpacked_code_is_on_a_volume_no_ray_node_mounts() -> None:
    """Ray uploads each job's folder from the dispatcher; a cache on a volume the Ray nodes mount would
    let any job alter another project's unpacked code before its next launch."""

    def volume(mount: str) -> str:
        return mount.split(":", 1)[0]

    cache = SERVICES["dispatcher"]["environment"]["TRAINMASTER_CODE_CACHE_PATH"]
    assert SERVICES["api"]["environment"]["TRAINMASTER_CODE_CACHE_PATH"] == cache  # retention removes it there
    holding = {
        name: {
            volume(m)
            for m in SERVICES[name]["volumes"]
            if cache.startswith(m.split(":", 1)[1].rstrip("/") + "/") or m.split(":", 1)[1] == cache
        }
        for name in ("api", "dispatcher")
    }
    assert holding["api"] == holding["dispatcher"] and len(holding["dispatcher"]) == 1, holding
    ray_nodes = [name for name, s in SERVICES.items() if s.get("command", [""])[0] == "ray"]
    for name in ray_nodes:
        mounted = {volume(m) for m in SERVICES[name].get("volumes", [])}
        assert not mounted & holding["dispatcher"], f"{name} mounts the code cache {holding['dispatcher']}"
