"""The client's address by the operator's trusted-proxy rule, and per-address counters keyed on
an IPv6 client's /64 (serve_app/client_address.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from serve_app.client_address import TrustedProxies, counted_address, parse_trusted_proxies
from serve_app.settings import Settings
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.http.test_body_before_caller import Upload, call, run

BALANCER = "10.0.0.5"
TWO_MB = str(2 * 1024 * 1024)


def scope(peer: str, *headers: tuple[str, str]) -> dict:
    return {"type": "http", "client": (peer, 1234),
            "headers": [(k.encode(), v.encode()) for k, v in headers]}


def test_forwarding_headers_are_read_only_from_a_trusted_proxy():
    proxies = TrustedProxies(parse_trusted_proxies("10.0.0.0/8, ::1"))
    forwarded = ("x-forwarded-for", "6.6.6.6, 203.0.113.7")

    assert proxies.client_of(scope(BALANCER, forwarded)) == "203.0.113.7"
    # What a client writes itself (the left of the header) is never believed ...
    assert proxies.client_of(scope(BALANCER, ("x-forwarded-for", "6.6.6.6, 10.0.0.9"))
                             ) == "6.6.6.6"
    # ... and nobody else's header is read at all.
    assert proxies.client_of(scope("198.51.100.1", forwarded)) == "198.51.100.1"
    assert TrustedProxies().client_of(scope(BALANCER, forwarded)) == BALANCER
    # RFC 7239 Forwarded wins over X-Forwarded-For, quoted IPv6 with a port included.
    assert proxies.client_of(scope("::1", forwarded, (
        "forwarded", 'for="[2001:db8:cafe::17]:4711";proto=https, for=10.1.2.3'))
        ) == "2001:db8:cafe::17"


def test_counters_key_an_ipv6_client_on_its_64():
    assert counted_address("2001:db8:1:2:aaaa::1") == counted_address("2001:db8:1:2::ffff")
    assert counted_address("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert counted_address("2001:db8:1:3::1") != counted_address("2001:db8:1:2::1")
    assert counted_address("::ffff:192.0.2.1") == counted_address("192.0.2.1") == "192.0.2.1"


def test_a_trusted_proxies_typo_refuses_the_settings(tmp_path: Path):
    with pytest.raises(ValidationError, match="not an IP address"):
        Settings(data_dir=tmp_path, trusted_proxies="10.0.0.0/8, lb.internal")


@pytest.fixture
def proxied_gateway(tmp_path: Path) -> Iterator[Gateway]:
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                     trusted_proxies="10.0.0.0/8"))


async def _hold_uploads(app, key: str, peer: str, forwarded_for: list[str]) -> list[int]:
    """Two large uploads from each of `forwarded_for` (through `peer`) held open, then one
    more from each: the statuses of those."""
    held, statuses = [], []
    for client in forwarded_for:
        for _ in range(2):
            upload = Upload(hold=True)
            held.append(asyncio.create_task(call(app, "POST", "/api/v1/embeddings", upload, {
                "authorization": f"Bearer {key}", "content-type": "application/json",
                "content-length": TWO_MB, "x-forwarded-for": client}, client=peer)))
            await upload.reading.wait()
        upload = Upload(hold=True)
        extra = asyncio.create_task(call(app, "POST", "/api/v1/embeddings", upload, {
            "authorization": f"Bearer {key}", "content-type": "application/json",
            "content-length": TWO_MB, "x-forwarded-for": client}, client=peer))
        reading = asyncio.create_task(upload.reading.wait())
        await asyncio.wait({extra, reading}, return_when=asyncio.FIRST_COMPLETED)
        statuses.append(extra.result()[0] if extra.done() else 0)  # 0: its body was read
        reading.cancel()
        held.append(extra)
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    return statuses


def test_clients_behind_the_balancer_have_upload_slots_of_their_own(
        proxied_gateway: Gateway):
    gw = proxied_gateway
    key = gw.create_key()["apiKey"]

    async def scenario(app):
        # Two clients behind the trusted balancer: two slots each, a third refused.
        assert await _hold_uploads(app, key, BALANCER, ["203.0.113.7", "203.0.113.8"]) == [
            429, 429]

    run(gw, scenario)


def test_a_client_rotating_through_its_ipv6_64_shares_one_upload_budget(gateway: Gateway):
    key = gateway.create_key()["apiKey"]

    async def scenario(app):
        held = []
        for n in (1, 2):
            upload = Upload(hold=True)
            held.append(asyncio.create_task(call(app, "POST", "/api/v1/embeddings", upload, {
                "authorization": f"Bearer {key}", "content-type": "application/json",
                "content-length": TWO_MB}, client=f"2001:db8:7:7::{n}")))
            await upload.reading.wait()
        upload = Upload(hold=True)
        status, _, body = await call(app, "POST", "/api/v1/embeddings", upload, {
            "authorization": f"Bearer {key}", "content-type": "application/json",
            "content-length": TWO_MB}, client="2001:db8:7:7:dead:beef::3")
        assert (status, body["code"], upload.reads) == (429, "RATE_LIMIT_EXCEEDED", 0)
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)

    run(gateway, scenario)


def test_a_spoofed_forwarding_header_from_an_untrusted_peer_is_ignored(gateway: Gateway):
    key = gateway.create_key()["apiKey"]
    peer = "198.51.100.20"

    async def scenario(app):
        held = []
        for forwarded_for in ("203.0.113.7", "203.0.113.8"):
            upload = Upload(hold=True)
            held.append(asyncio.create_task(call(app, "POST", "/api/v1/embeddings", upload, {
                "authorization": f"Bearer {key}", "content-type": "application/json",
                "content-length": TWO_MB, "x-forwarded-for": forwarded_for}, client=peer)))
            await upload.reading.wait()
        # The gateway trusts no proxy: a new X-Forwarded-For is this peer's own writing.
        upload = Upload(hold=True)
        status, _, body = await call(app, "POST", "/api/v1/embeddings", upload, {
            "authorization": f"Bearer {key}", "content-type": "application/json",
            "content-length": TWO_MB, "x-forwarded-for": "203.0.113.99"}, client=peer)
        assert (status, body["code"], upload.reads) == (429, "RATE_LIMIT_EXCEEDED", 0)
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)

    run(gateway, scenario)
