"""`/api_keys`: create, update, list, get and revoke keys. ADMIN keys only."""

from __future__ import annotations

from fastapi import APIRouter, Query

from serve_app.api.deps import AdminKey, JsonBody, State, run_db
from serve_app.control import api_keys as service
from serve_app.errors import invalid_request
from serve_app.schemas.api_keys import CreateApiKeyRequest, UpdateApiKeyRequest

router = APIRouter(tags=["API Keys"])


@router.post("/api_keys", dependencies=[JsonBody], summary="Create an API key")
async def create_api_key(body: CreateApiKeyRequest, key: AdminKey, state: State) -> dict:
    data = await run_db(state, lambda s: service.create_key(s, key.account_id, body))
    return {"data": data, "success": True}


@router.patch("/api_keys", dependencies=[JsonBody], summary="Update an API key")
async def update_api_key(body: UpdateApiKeyRequest, key: AdminKey, state: State) -> dict:
    record, key_hash = await run_db(state, lambda s: service.update_key(s, key.account_id, body))
    await state.key_changed([key_hash])
    return {"data": record, "success": True}


@router.get("/api_keys", summary="List active API keys")
async def list_api_keys(key: AdminKey, state: State) -> dict:
    data = await run_db(state, lambda s: service.list_keys(s, key.account_id))
    return {"object": "list", "data": data}


@router.get("/api_keys/{key_id}", summary="Get an API key")
async def get_api_key(key_id: str, key: AdminKey, state: State) -> dict:
    data = await run_db(state, lambda s: service.get_key(s, key.account_id, key_id))
    return {"data": data}


@router.delete("/api_keys", summary="Revoke an API key")
async def delete_api_key(key: AdminKey, state: State,
                         id: str | None = Query(None, max_length=64)) -> dict:
    if not id:
        raise invalid_request("id is required: the id of the API key to delete", "id")
    key_hash = await run_db(state, lambda s: service.delete_key(s, key.account_id, id))
    await state.key_changed([key_hash])
    return {"success": True}
