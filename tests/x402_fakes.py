"""Test servers for x402 payments on loopback sockets: a tiny fake Solana JSON-RPC node, and a
facilitator whose verdicts the test sets.

The x402 protocol's SVM client asks a node for the mint's account (owner program and
decimals) and a recent blockhash; this node answers those two methods for any mint (an SPL
Token mint with 6 decimals) and records the calls.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from solders.hash import Hash

TOKEN_PROGRAM = "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA"


def mint_account_data(decimals: int = 6) -> bytes:
    """An SPL mint account (82 bytes): mint authority option + key, supply, decimals,
    is_initialized, freeze authority option + key."""
    data = (
        (1).to_bytes(4, "little") + bytes(range(32))  # mint authority
        + (10**15).to_bytes(8, "little")  # supply
        + bytes([decimals, 1])  # decimals, is_initialized
        + (0).to_bytes(4, "little") + bytes(32)  # no freeze authority
    )
    assert len(data) == 82
    return data


class FakeSolanaRpc:
    """`with FakeSolanaRpc() as rpc:` serves on `rpc.url` until the block ends."""

    def __init__(self, *, decimals: int = 6, owner: str = TOKEN_PROGRAM) -> None:
        self.decimals = decimals
        self.owner = owner
        self.blockhash = str(Hash.new_unique())
        self.calls: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length))
                reply = fake.answer(request)
                body = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        method = request.get("method")
        self.calls.append(method)
        context = {"slot": 1000, "apiVersion": "2.0.0"}
        if method == "getAccountInfo":
            result: Any = {"context": context, "value": {
                "data": [base64.b64encode(mint_account_data(self.decimals)).decode(), "base64"],
                "executable": False, "lamports": 1_461_600, "owner": self.owner,
                "rentEpoch": 0, "space": 82}}
        elif method == "getLatestBlockhash":
            result = {"context": context,
                      "value": {"blockhash": self.blockhash, "lastValidBlockHeight": 2000}}
        else:
            return {"jsonrpc": "2.0", "id": request.get("id"),
                    "error": {"code": -32601, "message": f"Method not found: {method}"}}
        return {"jsonrpc": "2.0", "id": request.get("id"), "result": result}

    def __enter__(self) -> FakeSolanaRpc:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class FakeFacilitator:
    """An x402 facilitator on a loopback socket whose verdicts the test sets: `/verify`
    answers `valid` (a refusal names `insufficient_funds`, as for a fresh, unfunded payer),
    `/settle` succeeds with a fake transaction. `before_verify` runs on each verify call (a
    test looks at what was written by then); `calls` lists the operations asked."""

    def __init__(self, *, valid: bool = False,
                 before_verify: Callable[[], None] | None = None) -> None:
        self.valid = valid
        self.before_verify = before_verify
        self.calls: list[str] = []
        self.verify_failures: list[BaseException] = []  # what `before_verify` raised
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length))
                operation = self.path.rstrip("/").rsplit("/", 1)[-1]
                body = json.dumps(fake.answer(operation, request)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def answer(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(operation)
        network = request.get("paymentRequirements", {}).get("network")
        if operation == "verify":
            if self.before_verify is not None:
                try:
                    self.before_verify()
                except BaseException as exc:  # reported to the test, not to the gateway
                    self.verify_failures.append(exc)
            if self.valid:
                return {"isValid": True}
            return {"isValid": False, "invalidReason": "insufficient_funds"}
        transaction = "0x" + hashlib.sha256(json.dumps(request).encode()).hexdigest()
        return {"success": True, "transaction": transaction, "network": network}

    def __enter__(self) -> FakeFacilitator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
