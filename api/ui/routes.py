"""HTTP for the dashboard: `/` and `/ui` lead to `/ui/`, whose static files need no token.

The browser signs in with a project token kept in sessionStorage and sends it as a bearer header on
every API call; no page or asset here holds data, so serving them without auth reveals nothing.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC_DIR = Path(__file__).parent / "static"
UI_PREFIX = "/ui"

# No inline script or style, nothing from elsewhere; uPlot styles its elements through the CSSOM,
# which CSP allows. `connect-src 'self'` covers the API calls and the fetch()-read event streams.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse(f"{UI_PREFIX}/", status_code=307)


@router.get(UI_PREFIX)
async def ui_without_slash() -> RedirectResponse:
    return RedirectResponse(f"{UI_PREFIX}/", status_code=307)


def static_files() -> StaticFiles:
    return StaticFiles(directory=STATIC_DIR, html=True)


class UiSecurityHeaders:
    """Adds the CSP and its companions to every answer under /ui."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(UI_PREFIX):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
