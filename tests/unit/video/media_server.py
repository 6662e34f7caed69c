"""A stand-in for the web that serves clients' media: a real HTTP server on loopback that
serves the files a test publishes, records every request it gets, and can hold its answers
until the test lets them go (to have fetches in flight while the test does something else)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class MediaServer:
    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}
        self.requests: list[str] = []
        self.arrived = threading.Semaphore(0)  # released once per request received
        self.gate = threading.Event()  # answers wait for it while `held`
        self.gate.set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append(self.path)
                server.arrived.release()
                server.gate.wait(120)
                name = self.path.rsplit("/", 1)[-1]
                body, content_type = server.files.get(name, (b"missing", "text/plain"))
                self.send_response(200 if name in server.files else 404)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.port = self.http.server_address[1]
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def publish(self, name: str, body: bytes, content_type: str) -> str:
        """Serve `body` at the returned URL."""
        self.files[name] = (body, content_type)
        return f"http://{self.host}/files/{name}"

    def hold(self) -> None:
        """Keep answers waiting until `release`."""
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def wait_for_request(self, timeout_s: float = 120) -> None:
        assert self.arrived.acquire(timeout=timeout_s), "no request came"

    def close(self) -> None:
        self.gate.set()
        self.http.shutdown()
        self.http.server_close()
