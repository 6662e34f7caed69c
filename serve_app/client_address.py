"""The address a request came from, and the key the per-address counters count it under.

Behind a load balancer the socket's peer is the balancer, so every client would share one
upload slot, one sign-in window and one top-up budget. The operator names the proxies it runs
(`TRUSTED_PROXIES`); only a request whose peer is one of them has its `Forwarded` (RFC 7239)
or `X-Forwarded-For` header read, right to left, past every trusted hop, to the first address
that is not one: what a client writes itself at the left of the header is never believed.

Counters key an IPv6 client on its /64: one host is given a whole /64 and may rotate through
it at will, so a per-address key there would be no bound at all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import Scope

# Where the caller gate keeps the address it found (scope["state"]), so that every later
# reader (the routes, the access log) sees one answer.
CLIENT_ADDRESS = "client_address"

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_trusted_proxies(value: str) -> tuple[IpNetwork, ...]:
    """`TRUSTED_PROXIES`: addresses or networks separated by commas ("10.0.0.0/8, ::1").

    Raises ValueError naming an entry that is neither."""
    networks = []
    for entry in (part.strip() for part in value.split(",")):
        if entry:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"TRUSTED_PROXIES: {entry!r} is not an IP address or "
                                 "network") from None
    return tuple(networks)


def _ip(text: str) -> IpAddress | None:
    text = text.strip().strip('"')
    if text.startswith("["):  # Forwarded's "[2001:db8::1]:4711"
        text = text[1:text.find("]")] if "]" in text else text[1:]
    elif text.count(":") == 1:  # "192.0.2.1:4711"
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _forwarded_hops(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The addresses the proxies recorded, nearest last: `Forwarded`'s `for=` if the request
    has one, else `X-Forwarded-For`."""
    forwarded: list[str] = []
    x_forwarded_for: list[str] = []
    for name, value in headers:
        if name == b"forwarded":
            for element in value.decode("latin-1").split(","):
                for pair in element.split(";"):
                    key, _, item = pair.strip().partition("=")
                    if key.lower() == "for":
                        forwarded.append(item)
        elif name == b"x-forwarded-for":
            x_forwarded_for.extend(value.decode("latin-1").split(","))
    return forwarded or x_forwarded_for


class TrustedProxies:
    """The operator's proxies, and the client address of a request that came through them."""

    def __init__(self, networks: Iterable[IpNetwork] = ()) -> None:
        self.networks = tuple(networks)

    def trusts(self, address: IpAddress | None) -> bool:
        return address is not None and any(address in net for net in self.networks)

    def client_of(self, scope: Scope) -> str:
        """The client's address: the peer, or, when the peer is a trusted proxy, the nearest
        address its forwarding headers name that is not a trusted proxy ("-" for none)."""
        peer = (scope.get("client") or ("-",))[0]
        if not self.networks or not self.trusts(_ip(peer)):
            return peer
        client = peer
        for hop in reversed(_forwarded_hops(scope.get("headers", ()))):
            address = _ip(hop)
            if address is None:  # "unknown", an obfuscated name: nothing further is trusted
                break
            client = str(address)
            if not self.trusts(address):
                break
        return client

    def remember(self, scope: Scope) -> str:
        """`client_of(scope)`, kept in the request's state for `client_address`."""
        state = scope.setdefault("state", {})
        address = state.get(CLIENT_ADDRESS)
        if address is None:
            address = state[CLIENT_ADDRESS] = self.client_of(scope)
        return address


def client_address(scope: Scope) -> str:
    """The request's client address by the operator's trusted-proxy rule (found by the caller
    gate), or the socket's peer where the gate has not run ("-" when the server gave none)."""
    address = scope.get("state", {}).get(CLIENT_ADDRESS)
    if address is not None:
        return address
    return (scope.get("client") or ("-",))[0]


def counted_address(address: str | None) -> str:
    """The key per-address counters count `address` under: an IPv6 address's /64, an IPv4
    address itself (an IPv4-mapped IPv6 address as its IPv4 address)."""
    if not address:
        return "-"
    ip = _ip(address)
    if ip is None:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
