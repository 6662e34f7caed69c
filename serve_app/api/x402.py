"""`/x402/*`: wallet credit. Top up with a signed USDC payment; read a wallet's balance and
transactions (that wallet, signed in, or the operator's ADMIN key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request, Response
from sqlmodel import Session

from serve_app.api.deps import Context, Services, current_key, run_db, signed_in_caller
from serve_app.api.guarded_route import guarded_router
from serve_app.client_address import client_address, counted_address
from serve_app.errors import ApiError, admin_key_required, authentication_failed
from serve_app.http.render import json_response
from serve_app.money import from_nanos
from serve_app.pipeline import respond
from serve_app.wallets.history import wallet_balance, wallet_transactions
from serve_app.wallets.limits import (
    BALANCE_READS_PER_MINUTE,
    TRANSACTION_READS_PER_MINUTE,
    count_read,
)
from serve_app.wallets.payment_required import suggested_top_up
from serve_app.wallets.sign_in import normalize_address, siwx_header
from serve_app.wallets.topups import parse_amount, payment_header

router = guarded_router(prefix="/x402", tags=["x402"])

ADDRESS_PATTERN = r"^(0x[a-fA-F0-9]{40}|[1-9A-HJ-NP-Za-km-z]{32,44})$"


@router.post("/top-up", summary="Top up a wallet's credit with an x402 payment")
async def top_up(request: Request, ctx: Context, services: Services,
                 amount: Annotated[str | None, Query(
                     description="USD to top up (default: the minimum)")] = None) -> Response:
    header = payment_header(request.headers)
    if header is None:
        raise services.top_ups.requirements(str(request.url),
                                            parse_amount(amount, services.payments))
    body, receipt = await services.top_ups.top_up(
        header, counted_address(client_address(request.scope)))
    respond.payment_response_header(ctx, receipt)
    return json_response(ctx, body)


async def wallet_reader(request: Request, services: Services,
                        wallet_address: Annotated[str, Path(alias="walletAddress")]) -> str:
    """The wallet of the path, readable by that wallet signed in or the operator's admin;
    each read counted against its route's per-minute cap of the reader."""
    address = normalize_address(wallet_address)
    route, per_minute = (("transactions", TRANSACTION_READS_PER_MINUTE)
                          if "/transactions/" in request.url.path
                          else ("balance", BALANCE_READS_PER_MINUTE))
    header = siwx_header(request.headers)
    if header is not None:  # the wallet decides, whatever Authorization says (key_or_wallet)
        caller = await signed_in_caller(request, services, header)
        if caller.wallet_address != address:
            raise ApiError(403, "The signed-in wallet does not match the requested wallet",
                           code="X402_WALLET_MISMATCH")
        await count_read(services.limits, f"wallet:{address}", route, per_minute)
        return address
    if not request.headers.get("authorization"):
        raise authentication_failed("Authentication failed: sign in with the wallet "
                                    "(SIGN-IN-WITH-X header)")
    key = await current_key(request, services)
    if not key.is_admin:
        raise admin_key_required()
    if not key.is_operator:
        raise ApiError(403, "Only the wallet itself or the operator's ADMIN key may read "
                            "a wallet's credit", code="UNAUTHORIZED")
    await count_read(services.limits, key.account_id, route, per_minute)
    return address


WalletReader = Annotated[str, Depends(wallet_reader)]


@router.get("/balance/{walletAddress}", summary="A wallet's x402 credit")
async def get_balance(ctx: Context, address: WalletReader, services: Services) -> Response:
    now = services.billing.clock()
    found = await run_db(services, lambda s: wallet_balance(s, address, now))
    usd, diem = found.balances.usd_nanos, found.balances.diem_nanos
    data = {
        "walletAddress": address,
        "balanceUsd": float(from_nanos(usd)),
        "canConsume": usd + diem > 0,
        "minimumTopUpUsd": float(services.payments.min_top_up_usd),
        "suggestedTopUpUsd": float(suggested_top_up(services.payments)),
    }
    if diem:
        data["diemBalanceUsd"] = float(from_nanos(diem))
    return json_response(ctx, {"success": True, "data": data})


@router.get("/transactions/{walletAddress}", summary="A wallet's top-ups and charges")
async def get_transactions(
    ctx: Context, address: WalletReader, services: Services,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    offset: Annotated[int, Query(ge=0, le=100_000)] = 0,
) -> Response:
    def read(session: Session):
        return wallet_transactions(session, address, limit, offset)

    balance, page, more = await run_db(services, read)
    return json_response(ctx, {"success": True, "data": {
        "walletAddress": address,
        "currentBalance": float(from_nanos(balance)),
        "transactions": page,
        "pagination": {"limit": limit, "offset": offset, "hasMore": more},
    }})
