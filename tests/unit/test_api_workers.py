"""`trainmaster api` gives its worker processes time to start on a loaded machine: uvicorn's supervisor
kills a worker that does not answer its ping within `timeout_worker_healthcheck` (5 s by default), and a
CI rehearsal's `trainmaster up` saw every new worker killed that way until the API gave up."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from api import cli


def test_the_api_waits_for_slow_workers_instead_of_killing_them(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    fake_uvicorn = SimpleNamespace(run=lambda app, **options: seen.update(options, app=app))
    real_server = cli._server
    monkeypatch.setattr(cli, "_server", lambda name: fake_uvicorn if name == "uvicorn" else real_server(name))
    monkeypatch.setenv("TRAINMASTER_STREAM_SLOTS_DIR", "/tmp")  # no folder of its own to make and remove
    cli.api(host="127.0.0.1", port=1, workers=2, migrate=False, access_log=False)
    assert seen["app"] == "api.app:app_factory" and seen["workers"] == 2
    assert seen["timeout_worker_healthcheck"] >= 30
