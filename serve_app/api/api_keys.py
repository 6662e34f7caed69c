"""`/api_keys`: create, update, list, get and revoke keys. ADMIN keys only."""

from __future__ import annotations

from fastapi import Query, Request, Response
from sqlmodel import col, select

from serve_app.accounts import keys as service
from serve_app.api.deps import (
    AdminKey,
    Context,
    CurrentKey,
    JsonBody,
    Services,
    context_of,
    run_db,
)
from serve_app.api.guarded_route import guarded_router
from serve_app.billing.windows import next_epoch
from serve_app.db.tables import RateLimitEvent, iso_z
from serve_app.errors import invalid_request
from serve_app.http import render
from serve_app.limits.policy import api_tier_id
from serve_app.money import as_number
from serve_app.schemas.api_keys import CreateApiKeyRequest, UpdateApiKeyRequest
from serve_app.services import GatewayServices

router = guarded_router(tags=["API Keys"])


@router.post("/api_keys", dependencies=[JsonBody], summary="Create an API key")
async def create_api_key(body: CreateApiKeyRequest, ctx: Context, key: AdminKey,
                         services: Services) -> dict:
    await services.admission.admit_key_creation(ctx, key)
    data = await run_db(services, lambda s: service.create_key(s, key.account_id, body))
    return {"data": data, "success": True}


@router.patch("/api_keys", dependencies=[JsonBody], summary="Update an API key")
async def update_api_key(body: UpdateApiKeyRequest, key: AdminKey, services: Services) -> dict:
    record, key_hash = await run_db(services, lambda s: service.update_key(s, key.account_id, body))
    await services.key_changed([key_hash])
    return {"data": record, "success": True}


@router.get("/api_keys", summary="List active API keys")
async def list_api_keys(key: AdminKey, services: Services) -> dict:
    data = await run_db(services, lambda s: service.list_keys(s, key.account_id))
    return {"object": "list", "data": data}


# Registered before `/api_keys/{key_id}`, which would otherwise take these paths.
@router.get("/api_keys/rate_limits", summary="Rate limits, tier and balances of this key")
async def rate_limits(request: Request, key: CurrentKey) -> Response:
    services: GatewayServices = request.app.state.gateway  # not a dependency: the polled route
    balances = await services.billing.balances(key.account_id)
    tier, _ = services.limits.tiers.resolve(key.rate_limit_tier)
    # Serialised here (orjson), not through FastAPI's validation of a returned dict: this is
    # the route clients poll.
    # the context read directly, not as a dependency: this is the route clients poll
    return render.json_response(context_of(request), {"data": {
        "accessPermitted": balances.usd_nanos + balances.diem_nanos > 0,
        "apiTier": {"id": api_tier_id(tier, is_partner=key.is_partner), "isCharged": True},
        "balances": {"USD": as_number(balances.usd_nanos) or 0,
                     "DIEM": as_number(balances.diem_nanos) or 0},
        "keyExpiration": iso_z(key.expires_at),
        "nextEpochBegins": iso_z(next_epoch(services.billing.clock())),
        "rateLimits": services.limits.published(services.catalog.models, tier, key.is_partner),
    }})


@router.get("/api_keys/rate_limits/log", summary="The account's last 50 rate-limit events")
async def rate_limit_log(key: AdminKey, services: Services) -> dict:
    def newest(session) -> list[RateLimitEvent]:
        return list(session.exec(
            select(RateLimitEvent).where(RateLimitEvent.account_id == key.account_id)
            .order_by(col(RateLimitEvent.created_at).desc(), col(RateLimitEvent.id).desc())
            .limit(50)).all())

    events = await run_db(services, newest)
    return {"object": "list", "data": [
        {"apiKeyId": e.api_key_id, "modelId": e.model_id or "", "rateLimitTier": e.tier,
         "rateLimitType": e.limit_type, "timestamp": iso_z(e.created_at)} for e in events]}


@router.get("/api_keys/{key_id}", summary="Get an API key")
async def get_api_key(key_id: str, key: AdminKey, services: Services) -> dict:
    data = await run_db(services, lambda s: service.get_key(s, key.account_id, key_id))
    return {"data": data}


@router.delete("/api_keys", summary="Revoke an API key")
async def delete_api_key(key: AdminKey, services: Services,
                         id: str | None = Query(None, max_length=64)) -> dict:
    if not id:
        raise invalid_request("id is required: the id of the API key to delete", "id")
    key_hash = await run_db(services, lambda s: service.delete_key(s, key.account_id, id))
    await services.key_changed([key_hash])
    return {"success": True}
