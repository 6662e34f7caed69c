"""Security checks across the API: every admin route closed to inference keys and wallets, one
account's keys, usage and wallets never readable by another, URLs the server fetches refused
when they reach private networks (however they are spelled or redirected), and oversized or
malformed bodies refused before they are read whole."""

from __future__ import annotations

import ast
import asyncio
import base64
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from serve_app.api.deps import admin_key, operator_key
from serve_app.gateway import API_ROUTERS
from serve_app.net_guard import BlockedAddress, GuardedFetcher
from serve_app.settings import PROJECT_ROOT, Settings
from tests.unit.conftest import Gateway, make_gateway
from tests.wallets import Wallet, signed_in

ORIGIN = "http://testserver"


def _dependency_calls(dependant) -> Iterator:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _dependency_calls(sub)


def _admin_routes() -> list[tuple[str, str]]:
    found = []
    # The routers' own routes: FastAPI 0.137 and later keep an included router as one node
    # of the app's routes.
    for route in (route for router in API_ROUTERS for route in router.routes):
        if isinstance(route, APIRoute) and {admin_key, operator_key} & set(
                _dependency_calls(route.dependant)):
            path = route.path.replace("{key_id}", "some-id").replace("{slug}", "some-slug")
            found += [(method, "/api/v1" + path) for method in route.methods]
    return sorted(found)


@pytest.fixture
def wallet_gateway(tmp_path: Path) -> Iterator[Gateway]:
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                     rate_limit_backend="local", siwx_domains="testserver"))


def test_every_admin_route_refuses_inference_keys_and_wallets(wallet_gateway: Gateway):
    gw = wallet_gateway
    routes = _admin_routes()
    assert ("GET", "/api/v1/api_keys") in routes and ("GET", "/api/v1/billing/balance") in routes
    assert len(routes) >= 10
    inference = gw.auth(gw.create_key()["apiKey"])
    wallet = Wallet()
    for method, path in routes:
        resp = gw.client.request(method, path, headers=inference, json={})
        assert resp.status_code in (401, 403), (method, path, resp.text)
        assert resp.json()["code"] in ("AUTHENTICATION_FAILED", "UNAUTHORIZED"), resp.text
        sign_in = signed_in(gw.client, wallet, f"{ORIGIN}{path}",
                            f"{ORIGIN}/api/v1/chat/completions")
        resp = gw.client.request(method, path, headers=sign_in, json={})
        assert resp.status_code == 401, (method, path, resp.text)
        assert "error" in resp.json()


def _spend(gateway: Gateway) -> None:
    """One settled embeddings request of the first account, written as a route settles it."""
    from datetime import UTC, datetime

    from sqlmodel import Session

    from serve_app.billing import ledger
    from serve_app.billing.pricing import price
    from serve_app.db.engine import make_engine

    model = gateway.services.catalog.by_id["text-embedding-all-minilm-l6-v2"]
    payer, now = ledger.Payer(gateway.account_id), datetime.now(UTC)
    engine = make_engine(gateway.settings.resolved_database_url, write_transactions=True)
    with Session(engine) as session:
        ledger.hold(session, "req-first-account", payer, 10**6, now)
        ledger.settle(session, "req-first-account", payer, price(model, {"input": 5000}),
                      started_at=now, now=now)
        session.commit()
    engine.dispose()


def test_one_account_never_reads_or_changes_anothers_keys_or_usage(gateway: Gateway):
    _spend(gateway)
    own = gateway.client.get("/api/v1/billing/usage-history", headers=gateway.auth()).json()
    assert len(own["data"]) == 1
    other = gateway.cli("create-account", "--usd", "3")
    theirs = gateway.auth(other["apiKey"])
    mine = gateway.auth()
    my_key = gateway.create_key(description="mine")
    listed = gateway.client.get("/api/v1/api_keys", headers=theirs).json()["data"]
    assert my_key["id"] not in {k["id"] for k in listed}
    for method, path, body in (
            ("GET", f"/api/v1/api_keys/{my_key['id']}", None),
            ("PATCH", "/api/v1/api_keys", {"id": my_key["id"], "description": "stolen"}),
            ("DELETE", f"/api/v1/api_keys?id={my_key['id']}", None)):
        resp = gateway.client.request(method, path, headers=theirs, json=body)
        assert resp.status_code == 404, (method, resp.text)
    still = gateway.client.get(f"/api/v1/api_keys/{my_key['id']}", headers=mine).json()
    assert still["data"]["description"] == "mine"
    assert gateway.client.get("/api/v1/models",
                              headers=gateway.auth(my_key["apiKey"])).status_code == 200
    balance = gateway.client.get("/api/v1/billing/balance", headers=theirs).json()
    assert float(balance["balances"]["usd"]) == 3.0  # theirs, not the first account's 10
    history = gateway.client.get("/api/v1/billing/usage-history", headers=theirs)
    assert history.status_code == 200 and history.json()["data"] == [], history.text
    analytics = gateway.client.get("/api/v1/billing/usage-analytics", headers=theirs)
    assert analytics.status_code == 200 and analytics.json()["byModel"] == [], analytics.text


def test_a_wallet_reads_only_its_own_credit(wallet_gateway: Gateway):
    gw = wallet_gateway
    me, stranger = Wallet(), Wallet()
    url = f"{ORIGIN}/api/v1/x402/balance/{me.address}"
    own = gw.client.get(url, headers=signed_in(gw.client, me, url,
                                               f"{ORIGIN}/api/v1/chat/completions"))
    assert own.status_code == 200, own.text
    theirs = gw.client.get(url, headers=signed_in(gw.client, stranger, url,
                                                  f"{ORIGIN}/api/v1/chat/completions"))
    assert theirs.status_code == 403 and theirs.json()["code"] == "X402_WALLET_MISMATCH"
    inference = gw.auth(gw.create_key()["apiKey"])
    assert gw.client.get(url, headers=inference).status_code == 401


# ---- URLs the server fetches --------------------------------------------------------------

PRIVATE_URLS = [
    "http://127.0.0.1/x.mp4", "http://localhost/x.mp4", "http://127.1/x.mp4",
    "http://2130706433/x.mp4", "http://0x7f000001/x.mp4", "http://0.0.0.0/x.mp4",
    "http://10.1.2.3/x.mp4", "http://172.16.0.1/x.mp4", "http://192.168.1.1/x.mp4",
    "http://100.64.0.1/x.mp4", "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/x.mp4", "http://[::ffff:127.0.0.1]/x.mp4",
    "http://[::ffff:169.254.169.254]/x.mp4", "http://[fd00::1]/x.mp4",
    "http://[fe80::1]/x.mp4", "http://224.0.0.1/x.mp4",
    "file:///etc/passwd", "gopher://127.0.0.1:6379/_INFO", "ftp://10.0.0.1/x",
]


@pytest.mark.parametrize("url", PRIVATE_URLS)
def test_fetched_urls_never_reach_private_networks(gateway: Gateway, url: str):
    """Through an endpoint that fetches before any model runs (the video quote); every other
    fetching endpoint uses the same reader (see the next test)."""
    key = gateway.auth(gateway.create_key()["apiKey"])
    resp = gateway.client.post("/api/v1/video/quote", headers=key, json={
        "model": "video-upscaler", "duration": "auto", "video_url": url})
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST" and "video_url" in resp.text


def test_only_the_guard_fetches_client_urls():
    """Modules that open HTTP connections: the guard (client URLs), and the operator's own
    configured services (x402 facilitator, crypto RPC nodes), never a client's URL."""
    allowed = {"serve_app/net_guard.py", "serve_app/wallets/x402/facilitator.py",
               "serve_app/crypto/serving.py"}
    clients = set()
    for path in (PROJECT_ROOT / "serve_app").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in (
                    "AsyncClient", "Client", "urlopen", "create_connection"):
                clients.add(str(path.relative_to(PROJECT_ROOT)))
    assert clients <= allowed, clients - allowed


class _Redirector(BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.target)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("target", ["http://169.254.169.254/", "http://[::1]:1/",
                                    "http://10.0.0.1/", "file:///etc/passwd"])
def test_redirects_to_private_addresses_are_refused(target: str):
    handler = type("Redirect", (_Redirector,), {"target": target})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    # the redirecting server itself is let through (it stands for a public host)
    fetcher = GuardedFetcher(allowed_hosts=frozenset({f"127.0.0.1:{port}"}))
    try:
        with pytest.raises(BlockedAddress):
            asyncio.run(fetcher.fetch(f"http://127.0.0.1:{port}/clip.mp4"))
    finally:
        server.shutdown()


def test_a_name_resolving_to_any_private_address_is_refused(monkeypatch):
    """DNS rebinding: a name that answers a public and a private address is refused, and the
    connection goes to the checked address, never to a second lookup's answer."""
    from serve_app import net_guard

    async def public_and_private(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "127.0.0.1"]

    monkeypatch.setattr(net_guard, "_resolve", public_and_private)
    with pytest.raises(BlockedAddress, match="non-public"):
        asyncio.run(GuardedFetcher().fetch("http://rebind.example/clip.mp4"))


# ---- bodies ------------------------------------------------------------------------------

def _raw_http(port: int, head: bytes, timeout_s: float = 60.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(head)
        return sock.recv(65536)


def test_a_declared_oversized_body_is_refused_before_it_is_sent(gateway: Gateway):
    """Only the headers are sent, declaring 2 GB: the answer comes at once, the body is never
    awaited."""
    import uvicorn

    key = gateway.create_key()["apiKey"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(gateway.client.app, host="127.0.0.1", port=port,
                                           log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            threading.Event().wait(0.05)
        for path in ("/api/v1/chat/completions", "/api/v1/video/queue",
                     "/api/v1/image/upscale"):
            answer = _raw_http(port, (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                "Content-Length: 2000000000\r\n\r\n").encode())
            assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:200])
            assert b"PAYLOAD_TOO_LARGE" in answer
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize(("body", "content_type", "status"), [
    (b"{not json", "application/json", 400),
    (b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
    (b'{"model": "x", "messages": "' + b"\xff\xfe" * 10 + b'"}', "application/json", 400),
    (b"model=x", "application/x-www-form-urlencoded", 415),
    (base64.b64encode(b"\x00" * 64), "text/plain", 415),
])
def test_malformed_bodies_are_clear_400s(gateway: Gateway, body: bytes, content_type: str,
                                        status: int):
    key = gateway.auth(gateway.create_key()["apiKey"])
    for path in ("/api/v1/chat/completions", "/api/v1/video/queue", "/api/v1/embeddings"):
        resp = gateway.client.post(path, content=body,
                                   headers={**key, "Content-Type": content_type})
        assert resp.status_code == status, (path, resp.text[:200])
        assert "error" in resp.json()
