"""Where the SDK and CLI find the API: arguments, then environment, then ~/.trainmaster/config."""

from __future__ import annotations

import json
import os
import secrets
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
    """The config with `values` merged in (it holds a token): written under a fresh name that nothing was
    at (O_EXCL, no link followed, mode 0600 from the start) and renamed over the old one."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    merged = {**load_file(), **values}
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(merged, indent=2) + "\n")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def resolve(api_url: str | None = None, token: str | None = None) -> ClientConfig:
    stored = load_file()
    return ClientConfig(
        api_url=(api_url or os.environ.get("TRAINMASTER_API_URL") or stored.get("api_url") or DEFAULT_API_URL).rstrip(
            "/"
        ),
        token=token or os.environ.get("TRAINMASTER_TOKEN") or stored.get("token"),
    )
