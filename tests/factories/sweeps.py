"""Small sweep-request builders."""

from __future__ import annotations

from typing import Any


def sweep_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "toy-sweep",
        "spec": {"name": "toy", "entrypoint": "builtin:toy-curve", "config": {"steps": 10, "step_s": 0.0}},
        "parameters": {"hidden": {"values": [32, 64]}, "dropout": {"values": [0.0, 0.5]}},
        "metric": "loss",
        "mode": "min",
    }
    body.update(overrides)
    return body
