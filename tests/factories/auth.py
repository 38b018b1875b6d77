"""Tokens made through the real auth service, as `trainmaster token create` makes them."""

from __future__ import annotations

from api.auth import admin


def project_token(database_url: str, project: str = "alpha") -> str:
    return admin.project_token(database_url, project)


def job_token(database_url: str, job_id: str) -> str:
    return admin.job_token(database_url, job_id)
