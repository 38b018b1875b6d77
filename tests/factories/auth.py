"""Tokens made through the real auth service, as `trainmaster token create` makes them."""

from __future__ import annotations

from typing import Any

from api.auth import admin
from api.auth.principal import Scope


def project_token(database_url: str, project: str = "alpha") -> str:
    return admin.project_token(database_url, project)


def job_token(database_url: str, job_id: str) -> str:
    return admin.job_token(database_url, job_id)


def scoped_token(database_url: str, project: str = "default", scope: str = "admin", **options: Any) -> str:
    """A token of `scope` (admin, project, metrics), as `trainmaster token create --scope` makes it."""
    return admin.token(database_url, project, scope=Scope(scope), **options)
