"""Dependencies every domain shares: the app's own settings (those given to `create_app`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.settings import Settings


def app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


AppSettings = Annotated[Settings, Depends(app_settings)]
