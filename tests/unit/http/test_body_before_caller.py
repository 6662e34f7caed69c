"""Nothing of a body is read before the caller is known (serve_app/caller_gate.py).

The app is called as an ASGI server would, on the loop the test client runs it on, with a
`receive` that records every read and hands out the body only when the test says: so a test
sees whether the body was read at all, and holds a slow upload open as long as it likes."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from serve_app.api.guarded_route import needs_caller
from serve_app.gateway import API_ROUTERS
from serve_app.json_bodies import LARGE_JSON_BYTES, MAX_CONTAINERS
from serve_app.middleware import MAX_BODY_BYTES
from serve_app.settings import Settings
from tests.unit.conftest import Gateway, make_gateway

FIVE_MB = 5 * 1024 * 1024
# Routes that need a caller, each with a body that would be read whole today.
AUTHENTICATED = ("/api/v1/chat/completions", "/api/v1/embeddings", "/api/v1/video/queue",
                 "/api/v1/image/upscale", "/api/v1/api_keys", "/api/v1/crypto/rpc/base")


class Upload:
    """The client side of one request body: what was read, and the chunks still to send."""

    def __init__(self, chunks: list[bytes] | None = None, *, hold: bool = False) -> None:
        self.reads = 0
        self.chunks = list(chunks or [])
        self.hold = hold  # after the chunks, wait (a client that stopped sending)
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        self.reading.set()
        if self.chunks:
            chunk = self.chunks.pop(0)
            return {"type": "http.request", "body": chunk,
                    "more_body": bool(self.chunks) or self.hold}
        if self.hold:
            await self.release.wait()
            self.hold = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the body is over; the client stays connected
        raise AssertionError("unreachable")


async def call(app, method: str, path: str, upload: Upload, headers: dict[str, str], *,
               client: str = "198.51.100.7") -> tuple[int, dict[str, str], Any]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": (client, 40000),
             "server": ("testserver", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in
                         {"host": "testserver", **headers}.items()]}
    status, answer_headers, body = 0, {}, b""

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, answer_headers, body
        if message["type"] == "http.response.start":
            status = message["status"]
            answer_headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            body += message.get("body", b"")

    await app(scope, upload.receive, send)
    return status, answer_headers, json.loads(body) if body else None


def run(gateway: Gateway, scenario) -> Any:
    """Run `scenario(app)` on the loop that serves the gateway."""
    return gateway.client.portal.call(scenario, gateway.client.app)


@pytest.fixture
def quick_deadline_gateway(tmp_path: Path) -> Iterator[Gateway]:
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                     body_timeout_s=0.3))


def test_a_bad_key_is_refused_before_a_byte_of_the_body_is_read(gateway: Gateway):
    async def scenario(app):
        for path in AUTHENTICATED:
            for authorization in ("Bearer sk-not-a-key", "Basic dXNlcjpwYXNz"):
                upload = Upload(hold=True)  # a body that never comes
                status, _, body = await call(app, "POST", path, upload, {
                    "authorization": authorization, "content-type": "application/json",
                    "content-length": str(FIVE_MB)})
                assert (status, body["code"]) == (401, "AUTHENTICATION_FAILED"), (path, body)
                assert upload.reads == 0, path

    run(gateway, scenario)


def test_an_anonymous_body_is_never_read_and_the_route_answers_from_the_headers(
        gateway: Gateway):
    async def scenario(app):
        answers = {}
        for path in AUTHENTICATED:
            upload = Upload(hold=True)
            status, _, body = await call(app, "POST", path, upload, {
                "content-type": "application/json", "content-length": str(FIVE_MB)})
            answers[path] = status
            assert "error" in body, (path, body)
            assert upload.reads == 0, path
        # Inference routes answer with the x402 discovery, the others with a 401.
        assert answers["/api/v1/chat/completions"] == answers["/api/v1/image/upscale"] == 402
        assert answers["/api/v1/api_keys"] == answers["/api/v1/crypto/rpc/base"] == 401
        # A wallet header that does not even decode is a 401 at once, body unread.
        upload = Upload(hold=True)
        status, _, body = await call(app, "POST", "/api/v1/chat/completions", upload, {
            "sign-in-with-x": "not base64 at all!", "content-type": "application/json",
            "content-length": str(FIVE_MB)})
        assert (status, body["code"], upload.reads) == (401, "AUTHENTICATION_FAILED", 0)

    run(gateway, scenario)


def test_a_caller_not_known_yet_may_send_a_small_body_only(gateway: Gateway):
    async def scenario(app):
        upload = Upload(hold=True)
        status, _, body = await call(app, "POST", "/api/v1/x402/top-up", upload, {
            "content-type": "application/json", "content-length": str(2 * 1024 * 1024)})
        assert (status, body["code"], upload.reads) == (413, "PAYLOAD_TOO_LARGE", 0)

    run(gateway, scenario)


def test_a_slow_upload_does_not_hold_up_other_requests(gateway: Gateway):
    key = gateway.create_key()["apiKey"]

    async def scenario(app):
        slow = Upload([b'{"model": "x", "input": "'], hold=True)
        pending = asyncio.create_task(call(app, "POST", "/api/v1/embeddings", slow, {
            "authorization": f"Bearer {key}", "content-type": "application/json",
            "content-length": "100000"}))
        await slow.reading.wait()
        status, _, body = await call(app, "GET", "/api/v1/api_keys/rate_limits", Upload(),
                                     {"authorization": f"Bearer {key}"})
        assert status == 200, body
        assert not pending.done()  # still waiting for its body
        pending.cancel()

    run(gateway, scenario)


def test_a_body_that_does_not_arrive_in_time_is_a_408(quick_deadline_gateway: Gateway):
    gw = quick_deadline_gateway
    key = gw.create_key()["apiKey"]

    async def scenario(app):
        slow = Upload([b'{"model": "x", "input": "'], hold=True)
        status, _, body = await call(app, "POST", "/api/v1/embeddings", slow, {
            "authorization": f"Bearer {key}", "content-type": "application/json",
            "content-length": "100000"})
        assert status == 408, body
        assert body == {"error": "The request body did not arrive within 0.3 s",
                        "code": "REQUEST_TIMEOUT"}

    run(gw, scenario)


def test_one_client_address_has_at_most_two_large_uploads_at_once(gateway: Gateway):
    key = gateway.create_key()["apiKey"]
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json",
               "content-length": str(2 * 1024 * 1024)}

    async def scenario(app):
        first, second = Upload(hold=True), Upload(hold=True)
        tasks = [asyncio.create_task(call(app, "POST", "/api/v1/embeddings", up, headers))
                 for up in (first, second)]
        await first.reading.wait()
        await second.reading.wait()
        third = Upload(hold=True)
        status, answer, body = await call(app, "POST", "/api/v1/embeddings", third, headers)
        assert (status, body["code"], third.reads) == (429, "RATE_LIMIT_EXCEEDED", 0)
        assert int(answer["retry-after"]) >= 1
        # Another address is not held back by this one.
        other = Upload(hold=True)
        elsewhere = asyncio.create_task(call(app, "POST", "/api/v1/embeddings", other, headers,
                                             client="192.0.2.9"))
        await other.reading.wait()
        for task in (*tasks, elsewhere):
            task.cancel()
        await asyncio.gather(*tasks, elsewhere, return_exceptions=True)
        # Once they are over, the address may upload again.
        again = Upload(hold=True)
        retry = asyncio.create_task(call(app, "POST", "/api/v1/embeddings", again, headers))
        await again.reading.wait()
        retry.cancel()
        await asyncio.gather(retry, return_exceptions=True)

    run(gateway, scenario)


def test_a_body_over_the_cap_without_a_length_is_still_a_413(gateway: Gateway):
    key = gateway.create_key()["apiKey"]

    async def scenario(app):
        chunk = b" " * (1024 * 1024)
        upload = Upload([b"{"] + [chunk] * (MAX_BODY_BYTES // len(chunk) + 1))
        status, _, body = await call(app, "POST", "/api/v1/chat/completions", upload, {
            "authorization": f"Bearer {key}", "content-type": "application/json",
            "transfer-encoding": "chunked"})
        assert (status, body["code"]) == (413, "PAYLOAD_TOO_LARGE")

    run(gateway, scenario)


def test_a_large_body_of_nested_arrays_is_refused_unparsed(gateway: Gateway):
    """30 MB of `[[],[],...]` took 6.8 s to parse; a large body is counted first."""
    key = gateway.auth(gateway.create_key()["apiKey"])
    small = b'{"model": "x", "input": [' + b"[]," * MAX_CONTAINERS + b"[]]}"
    large = b'{"model": "x", "input": [' + b"[]," * (LARGE_JSON_BYTES // 3) + b"[]]}"
    assert len(small) < LARGE_JSON_BYTES < len(large)
    for bomb in (small, large):
        for path in ("/api/v1/embeddings", "/api/v1/chat/completions",
                     "/api/v1/image/upscale"):
            resp = gateway.client.post(path, content=bomb,
                                       headers={**key, "content-type": "application/json"})
            assert resp.status_code == 400, (path, resp.text[:200])
            assert resp.json()["code"] == "INVALID_REQUEST"
            assert "JSON arrays and objects" in resp.json()["error"]


def test_large_legitimate_bodies_are_still_read(gateway: Gateway):
    """A known caller's large JSON (a base64 image, a long text) is parsed and validated as
    before: the answers below come from the route, after its body was read."""
    key = gateway.auth(gateway.create_key()["apiKey"])
    text = "word " * (LARGE_JSON_BYTES // 4)
    resp = gateway.client.post("/api/v1/embeddings", headers=key,
                               json={"model": "text-embedding-all-minilm-l6-v2",
                                     "input": [text], "encoding_format": 7})
    assert resp.status_code == 400, resp.text[:300]
    assert "encoding_format" in json.dumps(resp.json()["details"])
    not_json = b'{"model": "x", "input": "' + b"a" * LARGE_JSON_BYTES + b'"'
    resp = gateway.client.post("/api/v1/embeddings", content=not_json,
                               headers={**key, "content-type": "application/json"})
    assert resp.status_code == 400 and "error" in resp.json()
    image = base64.b64encode(b"\x00" * (2 * LARGE_JSON_BYTES)).decode()
    resp = gateway.client.post("/api/v1/image/upscale", headers=key, json={"image": image})
    assert resp.status_code in (400, 503), resp.text[:300]
    assert resp.json()["code"] in ("CORRUPTED_IMAGE", "MODEL_OFFLINE")


def test_the_only_route_taking_a_body_from_anyone_is_the_top_up():
    """Every other route with a body needs a caller, so an unknown one's body is never read;
    the top-up reads none (its payment comes in a header): 1 MB is plenty."""
    public = sorted(
        (method, route.path) for router in API_ROUTERS for route in router.routes
        if isinstance(route, APIRoute) and not needs_caller(route)
        for method in route.methods & {"POST", "PUT", "PATCH", "DELETE"})
    assert public == [("POST", "/x402/top-up")]


def test_a_json_route_refuses_a_body_of_another_type_or_of_none_unread(gateway: Gateway):
    """FastAPI 0.115 parsed a body without a Content-Type as JSON on the event loop (5 MB of
    `[[],...]` stalled it 1.27 s); the guard answers 415 before reading it, on any FastAPI."""
    nested = b"[" + b"[]," * (FIVE_MB // 3) + b"[]]"

    async def scenario(app):
        for path in ("/api/v1/chat/completions", "/api/v1/embeddings", "/api/v1/video/queue",
                     "/api/v1/api_keys"):
            for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):
                upload = Upload([nested])
                headers = {"authorization": f"Bearer {gateway.admin_key}",
                           "content-length": str(len(nested))}
                if content_type:
                    headers["content-type"] = content_type
                status, _, body = await call(app, "POST", path, upload, headers)
                assert (status, body["code"]) == (415, "INVALID_CONTENT_TYPE"), (path, body)
                assert upload.reads == 0, (path, content_type)

    run(gateway, scenario)
