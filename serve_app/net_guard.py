"""Fetching URLs that clients name, without letting them reach our private network (SSRF), nor
hold the server's memory or time.

Every hop (redirects included) is resolved first; the request goes only if every address the
name resolves to is public (an IPv6 address embedding an IPv4 one, NAT64, 6to4, mapped or
compatible, is judged by the IPv4 address), and then to the checked address itself, so a DNS
answer that changes between check and connect (rebinding) cannot slip through.

The bytes are capped as they come off the wire, and again once decoded: the fetch asks for
`Accept-Encoding: identity`; a server that compresses anyway may use one gzip or deflate layer,
decoded a bounded step at a time and never past the cap (a stacked or other encoding is
refused). A whole fetch, redirects included, has one deadline besides the per-read timeout.
Headers the caller adds (credentials) go only to the origin (scheme, host, port) of the URL it
named: once a redirect leaves it they are dropped.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import zlib
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

MAX_REDIRECTS = 3
USER_AGENT = "inference-platform/1.0"
# The most one decompression step may produce: the cap is checked between steps.
DECODE_STEP_BYTES = 256 * 1024
ACCEPTED_ENCODINGS = ("gzip", "x-gzip", "deflate")

# IPv6 ranges whose last 32 bits are an IPv4 address (the mapped `::ffff:0:0/96` and 6to4
# `2002::/16` have their own `ipaddress` properties).
_EMBEDDING_IPV4 = (
    ipaddress.IPv6Network("64:ff9b::/96"),       # NAT64, well-known prefix (RFC 6052)
    ipaddress.IPv6Network("::/96"),              # IPv4-compatible (deprecated)
    ipaddress.IPv6Network("::ffff:0:0:0/96"),    # IPv4-translated (SIIT, RFC 2765)
)
# Local-use NAT64 (RFC 8215): the IPv4 address may sit anywhere in it, so never public.
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")


class BlockedAddress(Exception):
    """A fetch the guard refused. The subclasses say why; this class itself: a URL of another
    scheme, or a host resolving to a non-public address."""


class TooLarge(BlockedAddress):
    """The body, as sent or once decoded, passes the fetcher's cap."""


class TooManyRedirects(BlockedAddress):
    pass


class RefusedEncoding(BlockedAddress):
    """A `Content-Encoding` not accepted (stacked, or not gzip or deflate), or a body it does
    not decode. `reason` can be shown to the client."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class FetchTimedOut(BlockedAddress):
    """The whole fetch, redirects included, passed its deadline."""


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


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, 6to4, NAT64, compatible)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in network for network in _EMBEDDING_IPV4):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _LOCAL_NAT64:
            return False
        ip = embedded_ipv4(ip) or ip
    return ip.is_global and not ip.is_multicast


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), \
        parts.port or {"http": 80, "https": 443}.get(scheme)


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


class _CappedDecoder:
    """One gzip or deflate layer, decoded at most `DECODE_STEP_BYTES` at a time."""

    def __init__(self, encoding: str, url: str) -> None:
        self.gzip = encoding != "deflate"
        self.url = url
        self.started = False
        # deflate is meant to be zlib-wrapped, but some servers send it raw (tried next)
        self.inflate = zlib.decompressobj(31 if self.gzip else zlib.MAX_WBITS)

    def feed(self, data: bytes, out: bytearray, cap: int) -> None:
        """Decode `data` onto `out`, stopping once `out` passes `cap`."""
        while len(out) <= cap:
            step = min(DECODE_STEP_BYTES, cap + 1 - len(out))
            try:
                piece = self.inflate.decompress(data, step)
            except zlib.error as exc:
                if not self.gzip and not self.started:
                    self.started = True
                    self.inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise RefusedEncoding(f"{self.url}: the compressed body does not decode: {exc}",
                                      "its compressed body does not decode") from exc
            self.started = True
            out += piece
            if self.inflate.eof:
                data = self.inflate.unused_data
                if not (data and self.gzip):  # what follows a deflate stream is ignored
                    return
                self.inflate = zlib.decompressobj(31)  # the next member of a gzip file
                continue
            data = self.inflate.unconsumed_tail
            if not data and len(piece) < step:  # all input used, no output pending
                return


def _decoder(response: httpx.Response, url: str) -> _CappedDecoder | None:
    encodings = [e.strip().lower() for e in
                 response.headers.get_list("content-encoding", split_commas=True)]
    encodings = [e for e in encodings if e and e != "identity"]
    if not encodings:
        return None
    named = ", ".join(encodings)[:100]
    if len(encodings) > 1 or encodings[0] not in ACCEPTED_ENCODINGS:
        raise RefusedEncoding(
            f"{url}: Content-Encoding {named} is not accepted",
            f"the server sent it with Content-Encoding {named!r} (at most one gzip or deflate "
            "layer is accepted)")
    return _CappedDecoder(encodings[0], url)


class GuardedFetcher:
    def __init__(self, *, allowed_hosts: frozenset[str] = frozenset(), timeout_s: float = 10.0,
                 max_bytes: int = 2 * 1024 * 1024, deadline_s: float | None = None) -> None:
        # `host:port` pairs let through although private (tests, an internal search service).
        self.allowed_hosts = allowed_hosts
        self.timeout_s = timeout_s  # each connect and read
        self.max_bytes = max_bytes  # as sent, and once decoded
        # the whole fetch, redirects included (a server sending a byte at a time never
        # misses the per-read timeout)
        self.deadline_s = deadline_s if deadline_s is not None else 2 * timeout_s

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

    async def check(self, url: str) -> None:
        """Refuse (BlockedAddress) a URL the fetcher would not fetch: another scheme, or a host
        that resolves to a non-public address (OSError: one that does not resolve)."""
        await self._checked_address(url)

    async def fetch(self, url: str, *, method: str = "GET", json: object = None,
                    headers: dict[str, str] | None = None,
                    deadline_s: float | None = None, content: bytes | None = None) -> Fetched:
        """The answer to `url` after at most `MAX_REDIRECTS` redirects. `headers` go only to
        the origin of `url`; `deadline_s` (default: the fetcher's) bounds the whole fetch;
        `content`: the exact bytes to send (a signed body), instead of `json`.

        Raises BlockedAddress (or a subclass) for a refused fetch, httpx and OS errors for
        one that failed."""
        deadline = self.deadline_s if deadline_s is None else deadline_s
        try:
            async with asyncio.timeout(deadline):
                return await self._fetch(url, method, json, headers, content)
        except TimeoutError as exc:
            raise FetchTimedOut(f"{url} was not fetched within {deadline:g} s") from exc

    async def _fetch(self, url: str, method: str, json: object,
                     headers: dict[str, str] | None, content: bytes | None) -> Fetched:
        origin, extra = _origin(url), dict(headers or {})
        async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                host, address, port = await self._checked_address(url)
                if extra and _origin(url) != origin:
                    extra = {}  # another origin: the caller's headers stay behind, for good
                parts = urlsplit(url)
                netloc = f"[{address}]" if ":" in address else address
                pinned = parts._replace(netloc=f"{netloc}:{port}").geturl()
                request = client.build_request(
                    method, pinned, json=json, content=content,
                    headers={"Host": parts.netloc.rpartition("@")[2], "User-Agent": USER_AGENT,
                             **extra, "Accept-Encoding": "identity"},
                    extensions={"sni_hostname": host} if parts.scheme == "https" else None)
                response = await client.send(request, stream=True)
                try:
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        method, json, content = "GET", None, None
                        continue
                    body = await self._read_body(response, url)
                    return Fetched(url, response.status_code,
                                   response.headers.get("content-type", ""), body)
                finally:
                    await response.aclose()
        raise TooManyRedirects(f"too many redirects from {url}")

    async def _read_body(self, response: httpx.Response, url: str) -> bytes:
        too_large = f"{url} is larger than {self.max_bytes} bytes"
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise TooLarge(too_large)
        decoder = _decoder(response, url)
        body, received = bytearray(), 0
        async for chunk in response.aiter_raw():  # as sent: nothing decoded by httpx
            received += len(chunk)
            if received > self.max_bytes:
                raise TooLarge(too_large)
            if decoder is None:
                body += chunk
            else:
                decoder.feed(chunk, body, self.max_bytes)
                if len(body) > self.max_bytes:
                    raise TooLarge(f"{url} is larger than {self.max_bytes} bytes once decoded")
        return bytes(body)
