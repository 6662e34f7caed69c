"""What one wallet may do at once and per minute, as the reference limits it.

* At most `WALLET_REQUESTS_IN_FLIGHT` requests of one signed-in wallet on their way at once on
  each Gateway replica (X402_REQUESTS_IN_FLIGHT_PER_WALLET); the next is refused with 429
  `X402_CONCURRENCY_LIMIT` before anything is held or charged, and its slot is freed when its
  answer has ended (streams included).
* Sign-ins (SIGN-IN-WITH-X headers) per minute from one client address
  (`SIGN_INS_PER_CLIENT_PER_MINUTE`, SIWX_SIGN_INS_PER_CLIENT_PER_MINUTE) on each Gateway
  replica, counted before the signature is checked and its nonce written: a client making
  fresh wallets to sign in with writes at most that many nonces a minute (429 past it).
* Reads of a wallet's balance (`BALANCE_READS_PER_MINUTE`) and transactions
  (`TRANSACTION_READS_PER_MINUTE`) per minute, counted per reader (the wallet signed in, or
  the operator's account), in the limiter's backend (shared across replicas on Redis or Ray):
  429 `RATE_LIMIT_EXCEEDED` with Retry-After past them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import TTLCache

from serve_app.errors import ApiError, retry_after_s
from serve_app.limits.core import OK
from serve_app.limits.limit_headers import limit_headers
from serve_app.limits.policy import WINDOW_MS
from serve_app.limits.rate_limits import RateLimits

WALLET_REQUESTS_IN_FLIGHT = 5
SIGN_INS_PER_CLIENT_PER_MINUTE = 300
BALANCE_READS_PER_MINUTE = 30
TRANSACTION_READS_PER_MINUTE = 20
# How soon a wallet refused for too many requests at once may try again.
IN_FLIGHT_RETRY_AFTER_S = 1


def concurrency_limit(limit: int) -> ApiError:
    return ApiError(429, f"Too many concurrent requests: at most {limit} requests of one "
                         "wallet may be in flight at once; retry when one has finished "
                         "(nothing was charged)", code="X402_CONCURRENCY_LIMIT",
                    headers=limit_headers(retry_after_s=IN_FLIGHT_RETRY_AFTER_S))


class WalletsInFlight:
    """The requests of each wallet on their way on this replica."""

    def __init__(self, limit: int = WALLET_REQUESTS_IN_FLIGHT) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def open_requests(self, address: str) -> int:
        return self._open.get(address, 0)

    def take(self, address: str) -> Callable[[], None]:
        """A slot for one request of `address` (429 past the limit); call the returned
        function once the request has ended (more calls do nothing)."""
        taken = self._open.get(address, 0)
        if taken >= self.limit:
            raise concurrency_limit(self.limit)
        self._open[address] = taken + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._open[address] - 1
            if left:
                self._open[address] = left
            else:
                del self._open[address]

        return release


class SignInsPerClient:
    """Sign-ins per minute of each client address on this replica (a fixed window per
    address; at most 100,000 addresses remembered, each for a minute)."""

    def __init__(self, per_minute: int = SIGN_INS_PER_CLIENT_PER_MINUTE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._windows: TTLCache[str, list[float]] = TTLCache(maxsize=100_000, ttl=60.0,
                                                             timer=clock)

    def count(self, client: str | None) -> None:
        """One sign-in from `client` (None: an address the server was not told, counted
        together); 429 with Retry-After past the cap."""
        key = client or "-"
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window[0] >= 60.0:
            window = self._windows[key] = [now, 0]
        if window[1] >= self.per_minute:
            retry_after = retry_after_s(60.0 - (now - window[0]))
            raise ApiError(429, f"Rate limit exceeded. Please try again later (at most "
                                f"{self.per_minute} wallet sign-ins a minute from one "
                                f"address; retry after {retry_after} seconds).",
                           code="RATE_LIMIT_EXCEEDED",
                           headers=limit_headers(retry_after_s=retry_after))
        window[1] += 1


async def count_read(limits: RateLimits, reader: str, route: str, per_minute: int) -> None:
    """One read of `route` by `reader` against its per-minute cap: 429 with Retry-After past
    it (the reference's message)."""
    outcome = await limits.count_account(reader, f"x402_{route}", per_minute)
    if outcome.code == OK:
        return
    now_ms = limits.clock() * 1000
    retry_after = retry_after_s((outcome.window_ms + WINDOW_MS - now_ms) / 1000)
    raise ApiError(429, f"Rate limit exceeded. Please try again later (at most {per_minute} "
                        f"{route} reads per minute; retry after {retry_after} seconds).",
                   code="RATE_LIMIT_EXCEEDED", headers=limit_headers(retry_after_s=retry_after))
