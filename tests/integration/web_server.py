"""A stand-in for the outside web, as a real HTTP server on loopback: a search provider
(`POST /search`), pages to scrape (`GET /page/<name>`) and files a test publishes
(`GET /files/<name>`, see `publish`). It records what it was asked."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGES = {
    "zebra": "<html><head><title>Zebra facts</title><script>x=1</script></head>"
             "<body><p>Zebras have black and white stripes.</p></body></html>",
}


class FakeWeb:
    def __init__(self) -> None:
        self.searches: list[dict] = []
        self.fetched: list[str] = []
        self.files: dict[str, tuple[bytes, str]] = {}
        web = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                query = json.loads(self.rfile.read(length))
                web.searches.append(query)
                results = [{"title": "Lighthouse report", "url": "https://example.org/lh",
                            "content": "The lighthouse keeper is named Ada Lovelace."}]
                self._send(200, json.dumps({"results": results}).encode(), "application/json")

            def do_GET(self) -> None:
                web.fetched.append(self.path)
                name = self.path.rsplit("/", 1)[-1]
                if self.path.startswith("/files/") and name in web.files:
                    self._send(200, *web.files[name])
                elif name in PAGES:
                    self._send(200, PAGES[name].encode(), "text/html; charset=utf-8")
                else:
                    self._send(404, b"missing", "text/plain")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def publish(self, name: str, body: bytes, content_type: str) -> str:
        """Serve `body` at the returned URL."""
        self.files[name] = (body, content_type)
        return f"{self.base}/files/{name}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
