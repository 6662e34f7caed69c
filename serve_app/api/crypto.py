"""`/crypto/rpc/*`: the networks offered (public) and the JSON-RPC proxy (billed per credit);
the work is in serve_app/crypto/serving.py."""

from __future__ import annotations

from fastapi import Path, Request, Response

from serve_app.api.deps import Context, JsonBody, KeyOrWallet, Services
from serve_app.api.guarded_route import guarded_router

router = guarded_router(prefix="/crypto/rpc", tags=["Crypto RPC"])

_CALL_SCHEMA = {
    "type": "object",
    "required": ["method"],
    "properties": {
        "jsonrpc": {"type": "string", "enum": ["2.0"], "example": "2.0"},
        "method": {"type": "string", "example": "eth_chainId",
                   "description": "JSON-RPC method name; standard (1x), advanced (2x) or "
                                  "large (4x) pricing tier."},
        "params": {"type": "array", "items": {}, "example": []},
        "id": {"oneOf": [{"type": "integer"}, {"type": "string"}], "example": 1},
    },
}
_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"oneOf": [
        _CALL_SCHEMA, {"type": "array", "maxItems": 100, "items": _CALL_SCHEMA}]}}},
}


@router.get("/networks", summary="List supported crypto RPC networks")
async def list_networks(services: Services) -> dict:
    """The alphabetically sorted network slugs `POST /crypto/rpc/{network}` accepts. Public."""
    return {"networks": services.crypto_rpc.networks}


@router.post("/{network}", dependencies=[JsonBody], openapi_extra={"requestBody": _BODY},
             summary="Proxy a JSON-RPC request to a supported blockchain")
async def rpc_proxy(request: Request, ctx: Context, key: KeyOrWallet, services: Services,
                    network: str = Path(description="Network slug; GET /crypto/rpc/networks "
                                                    "lists them", examples=["ethereum-mainnet"]),
                    ) -> Response:
    """Forward a JSON-RPC 2.0 request, or a batch of up to 100, to the network's node. Credits
    per call are the network's base credits (20 for EVM chains and Starknet, 30 for zkSync and
    Solana) times the method's tier; a call answered with a JSON-RPC error costs 5 credits.
    The answer carries `X-Venice-RPC-Credits` and `X-Venice-RPC-Cost-USD`."""
    return await services.crypto_rpc.proxy(request, ctx, key, network)
