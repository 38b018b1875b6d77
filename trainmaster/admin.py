"""Clusters, projects and tokens over the REST API (`/v1/clusters`, `/v1/projects`, `/v1/tokens`).

What an admin token manages, and what a project token may read of its own: `trainmaster cluster`,
`trainmaster project` and `trainmaster token ls|revoke` call these.

    with trainmaster.admin.Admin() as admin:
        admin.add_cluster("gpu-a", "http://ray-a:8265", token_file="/etc/trainmaster/ray-a.token")
        admin.create_project("vision", cluster="gpu-a", max_priority=50, quota={"GPU": 8}, cohort="research")
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import httpx

from trainmaster import config as client_config
from trainmaster.errors import TrainmasterError, error_from_response
from trainmaster.models import Cluster, Project, ProjectStorage, StorageList, TokenCreated, TokenInfo

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Unset:
    """A keyword argument left out (where None means "clear it")."""


UNSET = Unset()


def _given(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def parse_resources(text: str, option: str = "--quota") -> dict[str, float]:
    """`GPU=8,CPU=64` -> {"GPU": 8.0, "CPU": 64.0}; `none` (or empty) -> {}."""
    if text.strip().lower() in ("", "none"):
        return {}
    amounts: dict[str, float] = {}
    for part in text.split(","):
        name, sep, amount = part.partition("=")
        try:
            amounts[name.strip()] = float(amount)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise TrainmasterError(f"{option} takes RESOURCE=AMOUNT[,...] (e.g. GPU=8,CPU=64), not {part!r}")
    return amounts


def parse_duration(text: str) -> timedelta | None:
    """`90d`, `12h`, `30m`, `3600` (seconds) or `never` (None)."""
    if text.strip().lower() == "never":
        return None
    match = _DURATION.match(text.lower())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration: give e.g. 90d, 12h, 30m, 3600 or never")
    return timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])


class Admin:
    """Configured like `trainmaster.Client` (arguments, then TRAINMASTER_API_URL / TRAINMASTER_TOKEN,
    then ~/.trainmaster/config); `transport` drives an app in process."""

    def __init__(
        self,
        api_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        resolved = client_config.resolve(api_url, token)
        headers = {"Authorization": f"Bearer {resolved.token}"} if resolved.token else {}
        self.api_url = resolved.api_url
        self._http = httpx.Client(base_url=resolved.api_url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self._http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise TrainmasterError(f"cannot reach the trainmaster API at {self.api_url}: {exc}") from exc
        if response.is_error:
            raise error_from_response(response)
        return None if response.status_code == 204 else response.json()

    # -- clusters ---------------------------------------------------------------------------------

    def add_cluster(
        self,
        name: str,
        address: str,
        *,
        token_file: str | None = None,
        token_env: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> Cluster:
        body = {"name": name, "address": address, "token_file": token_file, "token_env": token_env}
        return Cluster.model_validate(self._call("POST", "/v1/clusters", {**body, "labels": labels or {}}))

    def clusters(self) -> list[Cluster]:
        return [Cluster.model_validate(item) for item in self._call("GET", "/v1/clusters")["items"]]

    # -- projects ---------------------------------------------------------------------------------

    def create_project(
        self,
        name: str,
        *,
        cluster: str = "default",
        max_priority: int = 100,
        quota: dict[str, float] | None = None,
        cohort: str | None = None,
        borrowing_limit: dict[str, float] | None = None,
        lending_limit: dict[str, float] | None = None,
        storage_quota_bytes: int | None = None,
    ) -> Project:
        body: dict[str, Any] = {"name": name, "cluster": cluster, "max_priority": max_priority, "quota": quota or {}}
        body.update(
            _given(
                cohort=cohort,
                borrowing_limit=borrowing_limit,
                lending_limit=lending_limit,
                storage_quota_bytes=storage_quota_bytes,
            )
        )
        return Project.model_validate(self._call("POST", "/v1/projects", body))

    def projects(self) -> list[Project]:
        return [Project.model_validate(item) for item in self._call("GET", "/v1/projects")["items"]]

    def project(self, name: str) -> Project:
        return Project.model_validate(self._call("GET", f"/v1/projects/{name}"))

    def set_project(
        self,
        name: str,
        *,
        cluster: str | None = None,
        max_priority: int | None = None,
        quota: dict[str, float] | None = None,
        cohort: str | Unset | None = UNSET,
        borrowing_limit: dict[str, float] | Unset | None = UNSET,
        lending_limit: dict[str, float] | Unset | None = UNSET,
        checkpoint_retention_days: float | Unset | None = UNSET,
        storage_quota_bytes: int | Unset | None = UNSET,
    ) -> Project:
        """Change what is given; `cohort`, `borrowing_limit`, `lending_limit`,
        `checkpoint_retention_days` and `storage_quota_bytes` given as None are cleared."""
        body = _given(cluster=cluster, max_priority=max_priority, quota=quota)
        body.update(
            {
                key: value
                for key, value in (
                    ("cohort", cohort),
                    ("borrowing_limit", borrowing_limit),
                    ("lending_limit", lending_limit),
                    ("checkpoint_retention_days", checkpoint_retention_days),
                    ("storage_quota_bytes", storage_quota_bytes),
                )
                if not isinstance(value, Unset)
            }
        )
        return Project.model_validate(self._call("PATCH", f"/v1/projects/{name}", body))

    def storage(self) -> list[ProjectStorage]:
        """Bytes each project stores (live checkpoints, code packages) against its storage quota; a
        project token sees its own."""
        return StorageList.model_validate(self._call("GET", "/v1/storage")).items

    # -- tokens -----------------------------------------------------------------------------------

    def create_token(
        self,
        *,
        project: str | None = None,
        scope: str = "project",
        description: str | None = None,
        user: str | None = None,
        expires_in: timedelta | None = None,
        never_expires: bool = False,
    ) -> TokenCreated:
        body: dict[str, Any] = {"project": project, "scope": scope, "description": description, "user": user}
        if expires_in is not None:
            body["expires_in_s"] = expires_in.total_seconds()
        if never_expires:
            body["expires"] = False
        return TokenCreated.model_validate(self._call("POST", "/v1/tokens", body))

    def tokens(self) -> list[TokenInfo]:
        return [TokenInfo.model_validate(item) for item in self._call("GET", "/v1/tokens")["items"]]

    def revoke_token(self, token_id: str) -> None:
        """Revoke by id or by any unambiguous prefix of one (`token ls` shows 8 characters)."""
        self._call("DELETE", f"/v1/tokens/{self.resolve_token_id(token_id)}")

    def resolve_token_id(self, prefix: str) -> str:
        if len(prefix) == 36:
            return prefix
        matches = [token.id for token in self.tokens() if token.id.startswith(prefix.lower())]
        if len(matches) != 1:
            found = "no token" if not matches else f"{len(matches)} tokens"
            raise TrainmasterError(f"{found} with an id starting {prefix!r}: see `trainmaster token ls`")
        return matches[0]
