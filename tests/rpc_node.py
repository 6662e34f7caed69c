"""A fake JSON-RPC blockchain node for tests: a real HTTP server on a loopback socket, in a
thread, answering a few EVM and Solana methods, one method with a JSON-RPC error, and modes
for the failures a proxy must survive (slow, not JSON, HTTP 500).

    with RpcNode() as node:
        node.url            # http://127.0.0.1:PORT/
        node.requests       # every JSON body received (parsed), with its headers
        node.delay = 2.0    # answer after 2 s (timeouts)
        node.mode = "html"  # "ok", "html" (200 text/html), "status500", "not_rpc"
        node.gate = threading.Event()  # hold every request until the test sets it
        node.arrivals.acquire()        # wait for a request to have arrived
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# method -> result; ERRORS: method -> JSON-RPC error object.
RESULTS: dict[str, Any] = {
    "eth_chainId": "0x1",
    "eth_blockNumber": "0x10d4f",
    "eth_getBalance": "0xde0b6b3a7640000",
    "eth_sendRawTransaction": "0x" + "ab" * 32,
    "trace_block": [],
    "trace_replayTransaction": {"output": "0x", "trace": []},
    "getBalance": {"context": {"slot": 1}, "value": 1_000_000_000},
    "getSupply": {"context": {"slot": 1}, "value": {"total": 1}},
    "starknet_blockNumber": 1234,
}
ERRORS: dict[str, dict[str, Any]] = {
    "eth_call": {"code": -32000, "message": "execution reverted"},
}
METHOD_NOT_FOUND = {"code": -32601, "message": "the method does not exist"}


@dataclass
class Received:
    body: Any
    headers: dict[str, str]
    path: str


@dataclass
class RpcNode:
    mode: str = "ok"
    delay: float = 0.0
    requests: list[Received] = field(default_factory=list)
    gate: threading.Event | None = None
    arrivals: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the node first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    def answer(self, call: Any) -> dict[str, Any]:
        if not isinstance(call, dict):
            return {"jsonrpc": "2.0", "id": None,
                    "error": {"code": -32600, "message": "invalid request"}}
        method = call.get("method")
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": call.get("id")}
        if method in RESULTS:
            reply["result"] = RESULTS[method]
        else:
            reply["error"] = ERRORS.get(method, METHOD_NOT_FOUND)
        return reply

    def start(self) -> RpcNode:
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:  # quiet
                return

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                node.requests.append(Received(body, {k.lower(): v for k, v in
                                                     self.headers.items()}, self.path))
                node.arrivals.release()
                if node.gate is not None:
                    node.gate.wait()
                if node.delay:
                    time.sleep(node.delay)
                if node.mode == "html":
                    self._send(200, b"<html><body>Bad gateway</body></html>", "text/html")
                    return
                if node.mode == "status500":
                    self._send(500, b'{"error": "internal"}', "application/json")
                    return
                if node.mode == "not_rpc":
                    self._send(200, b'{"message": "hello"}', "application/json")
                    return
                if body is None:
                    reply: Any = {"jsonrpc": "2.0", "id": None,
                                  "error": {"code": -32700, "message": "parse error"}}
                elif isinstance(body, list):
                    reply = [node.answer(call) for call in body
                             if not isinstance(call, dict) or "id" in call]
                elif "id" not in body:
                    self._send(200, b"", "application/json")  # a notification
                    return
                else:
                    reply = node.answer(body)
                self._send(200, json.dumps(reply).encode(), "application/json")

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="rpc-node",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> RpcNode:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was just released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/"
