"""Response helpers shared by the inference routes: fast JSON, negotiated compression, and the
model headers of step 8."""

from __future__ import annotations

import gzip
from typing import Any

import brotli
import orjson
from fastapi import Request, Response

from serve_app.billing.ledger import Balances
from serve_app.catalog import CatalogModel
from serve_app.money import from_nanos

# Below this size compression costs more than it saves.
MIN_COMPRESS_BYTES = 1024


def _accepted_encoding(request: Request) -> str | None:
    offered = {part.split(";", 1)[0].strip().lower()
               for part in request.headers.get("accept-encoding", "").split(",")}
    if "br" in offered:
        return "br"
    if "gzip" in offered:
        return "gzip"
    return None


def json_response(request: Request, payload: Any, *, compress: bool = False) -> Response:
    """JSON (numpy arrays allowed), compressed with br or gzip when the client accepts it."""
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers: dict[str, str] = {}
    encoding = _accepted_encoding(request) if compress else None
    if encoding and len(body) >= MIN_COMPRESS_BYTES:
        body = brotli.compress(body, quality=4) if encoding == "br" else gzip.compress(
            body, compresslevel=5)
        headers["Content-Encoding"] = encoding
        headers["Vary"] = "Accept-Encoding"
    return Response(body, media_type="application/json", headers=headers)


def add_model_headers(request: Request, model: CatalogModel, router: str) -> None:
    """`x-service-model-*` and deprecation headers, through the one place that adds headers."""
    headers = request.state.response_headers
    headers["x-service-model-id"] = model.id
    headers["x-service-model-name"] = model.name
    headers["x-service-model-router"] = router
    headers.update(model.deprecation_headers())


def set_balance_headers(request: Request, before: Balances) -> None:
    """`x-service-balance-usd` / `-diem`: the balance before the request."""
    headers = request.state.response_headers
    headers["x-service-balance-usd"] = f"{from_nanos(before.usd_nanos):f}"
    headers["x-service-balance-diem"] = f"{from_nanos(before.diem_nanos):f}"
