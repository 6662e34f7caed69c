"""`POST /crypto/rpc/{network}`: one JSON-RPC call (or a batch of up to 100) forwarded to the
operator's node for that network, billed per credit.

The steps of one request:

1. the network must be one we offer (node URLs come only from the operator's config);
2. the body is parsed and checked: a JSON-RPC 2.0 object or a batch of 1 to 100 of them,
   every method allowed on the network's chain family (methods.py), no two calls of a batch
   sharing an id, no `"id": null` (calls.py), or 400 naming each offending method or id;
   nothing is counted or charged;
3. the caller's caps (per account, as the reference's per-user caps): requests per minute in
   the shared rate-limit backend (429 with `X-RateLimit-*` in requests), then credits per
   rolling 24 hours from the ledger (credits.py; 429 with `X-RateLimit-*` in credits, the reset
   when enough of the oldest leave the window); each 429 carries a `customMessage` naming the
   cap;
4. the most the call may cost (every call at its full tier) is held against the balance (402);
5. the body is forwarded through one shared HTTP client (total timeout, no redirects, capped
   answer size); a node that cannot be reached, answers a non-2xx status or something other
   than JSON-RPC gives a 500, and the hold is released (no charge). A failure the request
   caused (an answer over the size cap: 413; no answer within the timeout once the request
   was sent: 504) is charged the error rate for each call, counted toward the daily cap;
6. the credits are counted from the answer: each call at `base credits x tier`, a call the node
   answered with a JSON-RPC error at 5 credits; the hold is settled to that, and the node's
   answer goes back with `X-Venice-RPC-Credits` and `X-Venice-RPC-Cost-USD`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import Request, Response
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.pricing import Cost, price
from serve_app.crypto import idempotency
from serve_app.crypto.calls import (
    RpcRequest,
    bad_request,
    count_credits,
    error_credits,
    is_rpc_answer,
    parse_request,
)
from serve_app.crypto.credits import LINE_TYPE, CreditWindow
from serve_app.crypto.networks import Network, NodeConfig
from serve_app.db.engine import run_in_session
from serve_app.errors import ApiError, retry_after_s
from serve_app.limits.core import OK
from serve_app.limits.limit_headers import CapCount, limit_headers
from serve_app.limits.policy import WINDOW_MS
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import RoutedModel
from serve_app.money import NANOS_PER_UNIT
from serve_app.pipeline.context import RequestContext

if TYPE_CHECKING:
    from serve_app.limits.rate_limits import RateLimits
    from serve_app.pipeline.runner import RequestRunner

logger = logging.getLogger("serve_app.crypto")

# How often each replica deletes the Idempotency-Key entries past their 24 hours.
SWEEP_INTERVAL_S = 300.0
# The ledger's model type of crypto RPC usage (fits its 16-character column).
MODEL_TYPE = "crypto_rpc"
_NOT_JSON = object()


def rpc_model(network: Network, price_per_credit_usd: Decimal) -> CatalogModel:
    """The pseudo catalog model a network's calls are billed under: id `crypto-rpc-<slug>`,
    one priced line, `credits`."""
    return CatalogModel.model_construct(
        id=f"crypto-rpc-{network.slug}", type=MODEL_TYPE, name=f"Crypto RPC {network.slug}",
        description=f"JSON-RPC proxy to {network.slug}", deployment="crypto-rpc",
        engine="json-rpc", pricing={LINE_TYPE: {"usd": str(price_per_credit_usd)}},
        privacy="private")



def cost_usd(cost: Cost) -> str:
    """The charge, in USD to 8 decimal places."""
    usd = Decimal(cost.nanos) / NANOS_PER_UNIT
    return f"{usd.quantize(Decimal('0.00000001'), rounding=ROUND_HALF_UP):f}"


def upstream_error(message: str) -> ApiError:
    return ApiError(500, f"{message}; you were not charged", code="UPSTREAM_ERROR")


class CallerCaused(Exception):
    """The node failed on what the request asked (too large an answer, too long a wait):
    the caller is charged the error rate for each call (`error_credits`)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def answer(self, credits: int, usd: str) -> ApiError:
        return ApiError(self.status, f"{self.message}; charged {credits} credits ({usd} USD), "
                                     "the error rate of each call", code=self.code,
                        headers={"X-Venice-RPC-Credits": str(credits),
                                 "X-Venice-RPC-Cost-USD": usd})


def _sent(flag: list[bool]) -> Callable[[str, dict], Awaitable[None]]:
    """An httpcore trace callback that sets `flag[0]` once the request's body is sent."""

    async def trace(event: str, info: dict) -> None:
        if event.endswith("send_request_body.complete"):
            flag[0] = True

    return trace


def _replayed(replay: idempotency.Replay) -> Response:
    return Response(replay.response, media_type="application/json", headers={
        "X-Venice-RPC-Credits": str(replay.credits), "X-Venice-RPC-Cost-USD": replay.cost_usd,
        "Idempotent-Replayed": "true"})


# --- the proxy ----------------------------------------------------------------------------

class CryptoRpc:
    """The networks offered and the proxy; one per replica, with one shared HTTP client."""

    def __init__(self, config: NodeConfig, *, runner: RequestRunner, limits: RateLimits,
                 database: Engine, clock: Callable[[], datetime],
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.runner = runner
        self.limits = limits
        self.database = database
        self.clock = clock
        self.credits = CreditWindow()
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._models = {slug: rpc_model(network, config.price_per_credit_usd)
                        for slug, network in config.networks.items()}

    @property
    def networks(self) -> list[str]:
        return self.config.slugs

    def network(self, slug: str) -> Network:
        network = self.config.networks.get(slug)
        if network is None:
            message = (f"Unsupported network {slug!r}: GET /api/v1/crypto/rpc/networks lists "
                       "the networks offered")
            raise bad_request(message, [(("network",), message)])
        return network

    def model(self, slug: str) -> CatalogModel:
        return self._models[slug]

    def _http(self) -> httpx.AsyncClient:
        # Made on first use, inside the event loop that will use it.
        if self._client is None:
            timeout = self.config.timeout_s
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
                follow_redirects=False, transport=self._transport,
                limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
                headers={"user-agent": "inference-platform-crypto-rpc"})
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # The caps.

    async def _caps(self, key: KeyRecord, max_credits: int) -> None:
        """The per-minute request cap, then the daily credit cap (429 each)."""
        rpm = self.config.requests_per_minute
        outcome = await self.limits.count_account(key.account_id, "crypto_rpc", rpm)
        if outcome.code != OK:
            reset = math.ceil((outcome.window_ms + WINDOW_MS) / 1000)
            message = (f"Crypto RPC rate limit exceeded: at most {rpm} requests per minute "
                       f"per account (the per-minute request cap); retry after {reset} "
                       "(X-RateLimit-Reset, Unix seconds)")
            wait = retry_after_s(reset - self.limits.clock())  # the window's own clock
            raise ApiError(429, message, code="RATE_LIMIT_EXCEEDED",
                           headers=limit_headers(cap=CapCount(rpm, 0, reset), retry_after_s=wait),
                           extra={"customMessage": message})
        cap = self.config.credits_per_day
        now = self.clock()
        used = await self.credits.used(self.database, now, key.account_id)
        if used + max_credits > cap:
            resets = await self.credits.resets_at(self.database, now, key.account_id,
                                                  used + max_credits - cap)
            reset = math.ceil(resets.timestamp())
            message = (f"Crypto RPC credit limit exceeded: at most {cap} credits per rolling "
                       f"24 hours per account (the daily credit cap); {used} used, this request "
                       f"may take {max_credits}; it fits again at {reset} (X-RateLimit-Reset, "
                       "Unix seconds; X-RateLimit-Limit and -Remaining count credits here)")
            wait = retry_after_s(reset - now.timestamp())
            raise ApiError(429, message, code="RATE_LIMIT_EXCEEDED",
                           headers=limit_headers(cap=CapCount(cap, max(0, cap - used), reset),
                                                 retry_after_s=wait),
                           extra={"customMessage": message})

    # The node.

    async def _fetch(self, network: Network, body: bytes) -> bytes:
        """The node's answer body; 500 when the node fails (cannot be reached, not 2xx);
        `CallerCaused` when the request asked too much (an answer over the size cap, none
        within the timeout once the request was sent). The node's URL never appears in a
        message: it may carry the provider's key."""
        where = f"The {network.slug} node"
        limit = self.config.max_response_bytes
        sent = [False]
        try:
            async with asyncio.timeout(self.config.timeout_s):
                async with self._http().stream(
                        "POST", network.url, content=body, extensions={"trace": _sent(sent)},
                        headers={"content-type": "application/json",
                                 "accept": "application/json"}) as answer:
                    if not 200 <= answer.status_code < 300:
                        raise upstream_error(f"{where} answered HTTP {answer.status_code}")
                    chunks, size = [], 0
                    async for chunk in answer.aiter_bytes():
                        size += len(chunk)
                        if size > limit:
                            raise CallerCaused(
                                413, "PAYLOAD_TOO_LARGE",
                                f"{where} answered more than the {limit} bytes this proxy "
                                "returns: ask for less (a smaller block range, fewer calls)")
                        chunks.append(chunk)
                    return b"".join(chunks)
        except (TimeoutError, httpx.TimeoutException):
            logger.warning("crypto RPC: %s node timed out", network.slug)
            if sent[0]:
                raise CallerCaused(
                    504, "REQUEST_TIMEOUT",
                    f"{where} did not answer within {self.config.timeout_s:g} seconds: ask "
                    "for less (a smaller block range, fewer calls)") from None
            raise upstream_error(
                f"{where} did not answer within {self.config.timeout_s:g} seconds") from None
        except httpx.HTTPError as exc:
            logger.warning("crypto RPC: %s node unreachable (%s)", network.slug,
                           type(exc).__name__)
            raise upstream_error(f"{where} could not be reached") from None

    def _decode(self, network: Network, rpc: RpcRequest, raw: bytes) -> Any:
        if not raw.strip() and all(call.id is None for call in rpc.calls):
            return None  # notifications only: JSON-RPC answers nothing
        try:
            answer = json.loads(raw)
        except (ValueError, RecursionError):
            answer = _NOT_JSON
        if answer is _NOT_JSON or not is_rpc_answer(answer, rpc):
            logger.warning("crypto RPC: %s node answered something other than JSON-RPC",
                           network.slug)
            raise upstream_error(f"The {network.slug} node answered with something other than "
                                 "a JSON-RPC response")
        return answer

    async def proxy(self, request: Request, ctx: RequestContext, key: KeyRecord,
                    slug: str) -> Response:
        network = self.network(slug)
        body = await request.body()
        rpc = parse_request(body, network)
        idempotency_key = request.headers.get("idempotency-key")
        if idempotency_key is None:
            return await self._forward(ctx, key, slug, network, rpc)
        idem = idempotency.IdempotentCall(self.database, key.account_id, slug,
                                          idempotency_key, body, self.clock)
        replay = await idem.look()  # a read: a retry of a finished call is not counted again
        if replay is not None:
            return _replayed(replay)

        async def admitted() -> Response | None:
            # claimed only once the caps and the hold let the caller through
            twin = await idem.claim()
            return None if twin is None else _replayed(twin)

        try:
            answer = await self._forward(ctx, key, slug, network, rpc, admitted)
        except BaseException:
            await idem.drop()
            raise
        if not idem.claimed:  # a twin's answer, replayed
            return answer
        kept = bytes(answer.body)
        if len(kept) > self.config.max_stored_bytes:
            # Answered, not kept: a retry is forwarded (and charged) again.
            logger.info("crypto RPC: an answer of %d bytes is over the %d kept for "
                        "Idempotency-Key replays", len(kept), self.config.max_stored_bytes)
            await idem.drop()
            return answer
        await idem.complete(kept, int(answer.headers["X-Venice-RPC-Credits"]),
                            answer.headers["X-Venice-RPC-Cost-USD"])
        return answer

    async def sweep_idempotency(self) -> int:
        """Delete the Idempotency-Key entries older than 24 hours, in bounded batches; returns
        how many."""
        swept = 0
        while True:
            now = self.clock()

            def work(session: Session, now: datetime = now) -> int:
                gone = idempotency.sweep(session, now)
                session.commit()
                return gone

            # Off the money path's group commit: a session of its own.
            gone = await run_in_session(self.database, work)
            swept += gone
            if gone < idempotency.SWEEP_BATCH:
                return swept

    async def run_sweeper(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Each replica sweeps every `interval_s` (the deletes are the same on every one)."""
        while True:
            try:
                await self.sweep_idempotency()
            except Exception:
                logger.exception("crypto RPC: the Idempotency-Key sweep failed; retrying in "
                                 "%.0f s", interval_s)
            await asyncio.sleep(interval_s)

    async def _forward(self, ctx: RequestContext, key: KeyRecord, slug: str, network: Network,
                       rpc: RpcRequest,
                       admitted: Callable[[], Awaitable[Response | None]] | None = None
                       ) -> Response:
        """Caps, hold, node, settlement, on the request's bill (pipeline/bill.py).
        `admitted`: run once the caller is held; an answer it gives is returned in place of
        forwarding (the hold given back)."""
        model = self.model(slug)
        counted = False

        async def caps() -> None:
            # the credits count as in flight from the moment the cap admits them, so that
            # concurrent calls see them while this one's hold is written
            nonlocal counted
            await self._caps(key, rpc.max_credits)
            self.credits.start(key.account_id, rpc.max_credits)
            counted = True

        credits, bill = 0, None
        try:
            async with self.runner.admit(ctx, key, RoutedModel(model), limit=caps,
                                         calls_model=False, model_headers=False) as bill:
                await bill.hold(price(model, {LINE_TYPE: rpc.max_credits}))
                instead = await admitted() if admitted is not None else None
                if instead is not None:
                    return instead  # nothing delivered: the hold goes back
                try:
                    with ctx.step("upstream"):
                        raw = await self._fetch(network, json.dumps(rpc.payload).encode())
                    answer = self._decode(network, rpc, raw)
                except CallerCaused as failed:
                    credits = error_credits(rpc)
                    cost = price(model, {LINE_TYPE: credits})
                    bill.deliver(cost)
                    raise failed.answer(credits, cost_usd(cost)) from None
                credits = rpc.max_credits if answer is None else count_credits(rpc, answer)
                cost = price(model, {LINE_TYPE: credits})
                bill.deliver(cost)
        finally:
            if counted:
                spent = credits if bill is not None and bill.settled else 0
                self.credits.finish(key.account_id, rpc.max_credits, spent)
        return Response(raw, media_type="application/json",
                        headers={"X-Venice-RPC-Credits": str(credits),
                                 "X-Venice-RPC-Cost-USD": cost_usd(cost)})

