"""Small job-spec builders."""

from __future__ import annotations

from typing import Any


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "mlp-test",
        "entrypoint": "builtin:mlp",
        "scaling": {"num_workers": 2},
        "config": {"epochs": 1},
    }
    body.update(overrides)
    return body
