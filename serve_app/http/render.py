"""Answers as HTTP: the JSON body, compressed when the client accepts it, and an error's
answer (its body from serve_app/errors.py). The headers come from the request context
(serve_app/pipeline/respond.py), which the outermost middleware sends."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import brotli
import orjson
from fastapi import Response
from fastapi.responses import JSONResponse

from serve_app.errors import ApiError, error_body
from serve_app.pipeline.context import RequestContext

# Below this size compression costs more than it saves.
MIN_COMPRESS_BYTES = 1024


def _accepted_encoding(accept_encoding: str) -> str | None:
    offered = {part.split(";", 1)[0].strip().lower() for part in accept_encoding.split(",")}
    if "br" in offered:
        return "br"
    if "gzip" in offered:
        return "gzip"
    return None


def json_response(ctx: RequestContext, payload: Any, *, compress: bool = False) -> Response:
    """JSON (numpy arrays allowed), compressed with br or gzip when the client accepts it."""
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers: dict[str, str] = {}
    encoding = _accepted_encoding(ctx.accept_encoding) if compress else None
    if encoding and len(body) >= MIN_COMPRESS_BYTES:
        body = brotli.compress(body, quality=4) if encoding == "br" else gzip.compress(
            body, compresslevel=5)
        headers["Content-Encoding"] = encoding
        headers["Vary"] = "Accept-Encoding"
    return Response(body, media_type="application/json", headers=headers)


async def json_response_off_loop(ctx: RequestContext, payload: Any, *,
                                 compress: bool = False) -> Response:
    """`json_response` in a worker thread, for a large answer (a batch of embeddings: a
    megabyte of JSON to encode and compress) that would otherwise hold up every other request
    of the replica's event loop for tens of milliseconds."""
    return await asyncio.to_thread(json_response, ctx, payload, compress=compress)


def error_response(err: ApiError) -> JSONResponse:
    """An error's JSON answer: its status, its body, its headers."""
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)
