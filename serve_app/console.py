"""The web console's built files (console/, `npm run build`), served under `/console`.

The console is a static single-page app that calls the public API of the same origin; the
gateway only hands out its files, with headers that keep a browser holding an API key safe:
a strict Content-Security-Policy (scripts, styles and API calls from this origin only), no
framing, no referrer, no MIME sniffing.
"""

from __future__ import annotations

from pathlib import Path

from starlette.datastructures import MutableHeaders
from starlette.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.errors import ApiError
from serve_app.http.render import error_response

CONSOLE_PREFIX = "/console"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
        "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'; form-action 'self'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class ConsoleFiles:
    """Static files of the built console, or a clear 503 when it has not been built."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: ASGIApp | None = None

    def _static(self) -> ASGIApp | None:
        if self._files is None and (self.directory / "index.html").is_file():
            self._files = StaticFiles(directory=self.directory, html=True)
        return self._files

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == scope.get("root_path", ""):  # `/console` -> `/console/`
            response = RedirectResponse(f"{scope.get('root_path', '')}/", status_code=308)
            await response(scope, receive, send)
            return
        files = self._static()
        if files is None:
            response = error_response(ApiError(
                503, "The web console is not built on this server: run `make install` (it "
                     "runs `npm run build` in console/)"))
            await response(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await files(scope, receive, send_secured)
