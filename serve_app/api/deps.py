"""Typed dependencies, so a route's signature says what it needs (the services, the key, an
admin key).

Every dependency is `async def`, even those that never await: FastAPI runs a plain `def`
dependency in a worker thread, a hop that cost the ingress about a sixth of its CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from sqlmodel import Session
from starlette.types import Scope

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.ledger import Balances
from serve_app.billing.service import RemainingCredit
from serve_app.caller_gate import bearer_secret_of, checked_sign_in
from serve_app.client_address import client_address
from serve_app.db.engine import run_in_session
from serve_app.errors import ApiError, admin_key_required, authentication_failed
from serve_app.pipeline import respond
from serve_app.pipeline.context import RequestContext
from serve_app.services import GatewayServices
from serve_app.wallets import payment_required
from serve_app.wallets.sign_in import SignedInWallet, siwx_header

T = TypeVar("T")

# Where a wallet's request keeps the release of its in-flight slot (serve_app/wallets/limits.py).
WALLET_SLOT = "wallet_slot"


async def get_services(request: Request) -> GatewayServices:
    return request.app.state.gateway


Services = Annotated[GatewayServices, Depends(get_services)]


def context_of(request: Request) -> RequestContext:
    """The request's context, made by the outermost middleware (a fresh one where an app is
    run without it). The auth dependencies read it through this call rather than through a
    dependency of their own: each dependency FastAPI solves costs a few microseconds on every
    request."""
    scope_state = request.scope.setdefault("state", {})
    ctx = scope_state.get("context")
    if ctx is None:
        ctx = scope_state["context"] = RequestContext(
            scope_state.get("request_id", "-"), request.headers.get("accept-encoding", ""))
    return ctx


async def request_context(request: Request) -> RequestContext:
    return context_of(request)


Context = Annotated[RequestContext, Depends(request_context)]


def bearer_secret(request: Request) -> str:
    return bearer_secret_of(request.headers.get("authorization"))


async def current_key(request: Request, services: Services) -> KeyRecord:
    ctx = context_of(request)
    with ctx.step("auth"):
        # Found by the caller gate before the body was read; looked up here without it.
        key = ctx.authenticated_key or await services.keys.authenticate(bearer_secret(request))
        ctx.caller = key
        services.limits.check_failed_budget(key)
        respond.balance_headers(ctx, await services.billing.balances(key.account_id))
    return key


async def caller_key(request: Request) -> KeyRecord:
    """`current_key` as a dependency of its own: the services read from the app, not solved
    as a second dependency (each one FastAPI solves costs every request of the route)."""
    return await current_key(request, request.app.state.gateway)


CurrentKey = Annotated[KeyRecord, Depends(caller_key)]

async def inference_caller(request: Request, services: Services) -> KeyRecord:
    """The caller of an inference endpoint: a wallet signed in with SIGN-IN-WITH-X, or else a
    Bearer key (`key_or_wallet`). With neither, the x402 discovery 402."""
    if not request.headers.get("authorization") and siwx_header(request.headers) is None:
        host = request.headers.get("host", "")
        raise payment_required.discovery(request, services.payments,
                                         services.wallets.domain_for(host))
    return await key_or_wallet(request, services)


async def key_or_wallet(request: Request, services: Services) -> KeyRecord:
    """A wallet signed in with SIGN-IN-WITH-X, or else a Bearer key; 401 with neither.

    The wallet header decides: a request carrying both (a client that sends its usual
    Authorization header to every route) is the wallet's, and a bad wallet header is a 401
    whatever the key."""
    header = siwx_header(request.headers)
    if header is None:
        if request.headers.get("authorization"):
            return await current_key(request, services)
        raise authentication_failed("Authentication failed: send an API key "
                                    "('Authorization: Bearer <key>') or a SIGN-IN-WITH-X header")
    caller = await signed_in_caller(request, services, header)
    scope_state = request.scope.setdefault("state", {})
    if WALLET_SLOT not in scope_state and caller.wallet_address:
        # One of the wallet's requests in flight until its answer ends (release_wallet_slot).
        scope_state[WALLET_SLOT] = services.wallets.in_flight.take(caller.wallet_address)
    return caller


def release_wallet_slot(scope: Scope) -> None:
    """Free the in-flight slot a wallet's request took (key_or_wallet), once it has ended."""
    release = scope.get("state", {}).pop(WALLET_SLOT, None)
    if release is not None:
        release()


async def signed_in_caller(request: Request, services: GatewayServices,
                           header: str) -> KeyRecord:
    """The wallet of a SIGN-IN-WITH-X header, as the request's caller (401 if it does not
    verify), with its balance headers."""
    ctx = context_of(request)
    with ctx.step("auth"):
        wallet = await services.wallets.authenticate(
            header, request.headers.get("host", ""), client=client_address(request.scope),
            checked=checked_sign_in(request.scope, header))
        key = ctx.caller = wallet.caller
        services.limits.check_failed_budget(key)
        respond.balance_headers(ctx, await remaining_credit(ctx, services, wallet))
    return key


async def remaining_credit(ctx: RequestContext, services: GatewayServices,
                           wallet: SignedInWallet) -> Balances:
    """`X-Balance-Remaining` on a wallet's answer; returns the balance before the request
    (0 for a wallet whose account row is not written yet: nothing to read)."""
    account_id = wallet.caller.account_id
    before = (await services.billing.balances(account_id) if wallet.has_account
              else Balances(0, 0))
    respond.remaining_credit_header(ctx, RemainingCredit(services.billing, account_id, before))
    return before


# A Bearer key, or a wallet (modelled as a key of its wallet account, without a secret).
InferenceCaller = Annotated[KeyRecord, Depends(inference_caller)]
# The same for routes that answer a missing credential with 401 (the crypto RPC proxy).
KeyOrWallet = Annotated[KeyRecord, Depends(key_or_wallet)]


async def admin_key(key: CurrentKey) -> KeyRecord:
    if not key.is_admin:
        raise admin_key_required()
    return key


AdminKey = Annotated[KeyRecord, Depends(admin_key)]


async def operator_key(key: AdminKey) -> KeyRecord:
    """An ADMIN key of the operator's account: for what every account sees (characters)."""
    if not key.is_operator:
        raise ApiError(403, "Only the operator's account may publish characters and reviews",
                       code="UNAUTHORIZED")
    return key


OperatorKey = Annotated[KeyRecord, Depends(operator_key)]


async def require_json(request: Request) -> None:
    """415 for a body that is not JSON, before anything tries to parse it."""
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        return
    if not content_type and request.headers.get("content-length") in (None, "0"):
        return  # no body at all: validation reports the missing fields
    raise ApiError(415, f"Invalid content type {content_type or '(none)'!r}: "
                        "send application/json", code="INVALID_CONTENT_TYPE")


JsonBody = Depends(require_json)


async def run_db(services: GatewayServices, work: Callable[[Session], T]) -> T:
    """Run blocking database work off the event loop, in a session of its own."""
    return await run_in_session(services.engine, work)
