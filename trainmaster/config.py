"""Where the SDK and CLI find the API: arguments, then environment, then ~/.trainmaster/config."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_API_URL = "http://127.0.0.1:8000"


def home() -> Path:
    return Path(os.environ.get("TRAINMASTER_HOME", "~/.trainmaster")).expanduser()


def config_path() -> Path:
    return home() / "config"


@dataclass(frozen=True)
class ClientConfig:
    api_url: str
    token: str | None


def load_file() -> dict[str, str]:
    path = config_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def save_file(values: dict[str, str]) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = {**load_file(), **values}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(merged, indent=2) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def resolve(api_url: str | None = None, token: str | None = None) -> ClientConfig:
    stored = load_file()
    return ClientConfig(
        api_url=(api_url or os.environ.get("TRAINMASTER_API_URL") or stored.get("api_url") or DEFAULT_API_URL).rstrip(
            "/"
        ),
        token=token or os.environ.get("TRAINMASTER_TOKEN") or stored.get("token"),
    )
