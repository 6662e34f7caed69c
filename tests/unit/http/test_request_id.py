"""The request id: a client's usable `X-Request-ID` is the request's id and is echoed; otherwise
the platform's id goes out as both `X-Request-ID` and `CF-RAY`, once each."""

from __future__ import annotations

import re

import pytest

from serve_app.request_id import DropUnusableRequestId, client_request_id


def _ids(resp) -> tuple[list[str], list[str]]:
    return resp.headers.get_list("x-request-id"), resp.headers.get_list("cf-ray")


def test_the_clients_request_id_is_the_request_id_and_is_echoed(gateway):
    sent = "req-01HZY8K3V5-abc_DEF.42"
    for resp in (gateway.client.get("/api/v1/models", headers={"X-Request-ID": sent}),
                 gateway.client.get("/api/v1/api_keys", headers={"x-request-id": sent}),  # 401
                 gateway.client.get("/elsewhere", headers={"x-request-id": sent})):  # 404
        assert _ids(resp) == ([sent], [sent]), resp.status_code


def test_without_a_client_id_the_platforms_id_is_sent_once_as_both(gateway):
    resp = gateway.client.get("/api/v1/models")
    request_ids, rays = _ids(resp)
    assert len(request_ids) == len(rays) == 1
    assert request_ids == rays
    assert re.fullmatch(r"[0-9a-f]{32}", rays[0])
    assert gateway.client.get("/api/v1/models").headers["cf-ray"] != rays[0]


@pytest.mark.parametrize("bad", ["x" * 129, "has space", "tab\there", "", "caf\u00e9"])
def test_an_unusable_client_id_is_ignored(gateway, bad):
    resp = gateway.client.get("/api/v1/models", headers={"x-request-id": bad.encode("utf-8")})
    assert resp.status_code == 200
    request_ids, rays = _ids(resp)
    assert request_ids == rays
    assert re.fullmatch(r"[0-9a-f]{32}", rays[0])


def test_the_longest_usable_client_id_is_kept():
    assert client_request_id([(b"x-request-id", b"a" * 128)]) == "a" * 128
    assert client_request_id([(b"x-request-id", b"a" * 129)]) is None
    assert client_request_id([(b"x-request-id", b"first"), (b"x-request-id", b"second")]
                              ) == "first"


async def test_serves_hook_drops_an_unusable_id_before_serve_reads_it():
    """Serve's own middleware echoes whatever X-Request-ID the request has when it reaches it;
    the hook outside it leaves a usable one and removes one that is not."""
    seen: list[list[tuple[bytes, bytes]]] = []

    async def inner(scope, receive, send) -> None:
        seen.append(scope["headers"])

    hook = DropUnusableRequestId(inner)
    for headers in ([(b"x-request-id", b"fine-id"), (b"accept", b"*/*")],
                    [(b"x-request-id", b"not fine"), (b"accept", b"*/*")]):
        await hook({"type": "http", "headers": headers}, None, None)
    assert seen == [[(b"x-request-id", b"fine-id"), (b"accept", b"*/*")],
                    [(b"accept", b"*/*")]]
