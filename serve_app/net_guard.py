"""Fetching URLs that clients name, without letting them reach our private network (SSRF).

Every hop (redirects included) is resolved first; the request goes only if every address the
name resolves to is public, and then to the checked address itself, so a DNS answer that
changes between check and connect (rebinding) cannot slip through. Sizes are capped while
reading, before anything is decoded.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

MAX_REDIRECTS = 3


class BlockedAddress(Exception):
    pass


@dataclass(frozen=True)
class Fetched:
    url: str
    status: int
    content_type: str
    body: bytes


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback IP address (not a name that merely resolves to one)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


class GuardedFetcher:
    def __init__(self, *, allowed_hosts: frozenset[str] = frozenset(), timeout_s: float = 10.0,
                 max_bytes: int = 2 * 1024 * 1024) -> None:
        # `host:port` pairs let through although private (tests, an internal search service).
        self.allowed_hosts = allowed_hosts
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    async def _checked_address(self, url: str) -> tuple[str, str, int]:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BlockedAddress(f"only http and https URLs can be fetched: {url}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = await _resolve(parts.hostname, port)
        if f"{parts.hostname}:{port}" in self.allowed_hosts:
            return parts.hostname, addresses[0], port
        blocked = [a for a in addresses if not is_public(a)]
        if not addresses or blocked:
            raise BlockedAddress(f"{parts.hostname} resolves to a non-public address")
        return parts.hostname, addresses[0], port

    async def fetch(self, url: str, *, method: str = "GET", json: object = None,
                    headers: dict[str, str] | None = None) -> Fetched:
        async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                host, address, port = await self._checked_address(url)
                parts = urlsplit(url)
                netloc = f"[{address}]" if ":" in address else address
                pinned = parts._replace(netloc=f"{netloc}:{port}").geturl()
                request = client.build_request(
                    method, pinned, json=json,
                    headers={"Host": parts.netloc, "User-Agent": "inference-platform/1.0",
                             **(headers or {})},
                    extensions={"sni_hostname": host} if parts.scheme == "https" else None)
                response = await client.send(request, stream=True)
                try:
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        method, json = "GET", None
                        continue
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > self.max_bytes:
                            raise BlockedAddress(f"{url} is larger than {self.max_bytes} bytes")
                    return Fetched(url, response.status_code,
                                   response.headers.get("content-type", ""), bytes(body))
                finally:
                    await response.aclose()
        raise BlockedAddress(f"too many redirects from {url}")
