"""Large JSON bodies, parsed in a worker thread after a count of what they would build.

FastAPI parses a route's JSON body with `json.loads` on the event loop. The cost of a parse is
in the Python objects it makes: 30 MB of `[[],[],...]` is ten million lists, seconds of the
parser holding the interpreter, in a worker thread or not. So the arrays and objects of a
body long enough to hold more than `MAX_CONTAINERS` are counted first, at C speed
(`bytes.count`), and past it the body is refused unparsed. What passes is parsed inline under
1 MB (milliseconds), and by orjson in one of two worker threads above. Legitimate large bodies
are base64 media and long texts: a few containers each. Every JSON route's body comes here
through its guard (api/guarded_route.py); routes that read their bodies themselves call
`parse_json`.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from serve_app.errors import invalid_request, validation_error_response

LARGE_JSON_BYTES = 1024 * 1024
# Arrays and objects a large body may hold (brackets inside strings count too): parsing that
# many takes orjson tens of milliseconds.
MAX_CONTAINERS = 200_000

_parsers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="json-parse")


# A shorter body cannot hold more than MAX_CONTAINERS: it is not counted.
COUNTED_FROM_BYTES = 2 * MAX_CONTAINERS


# Counted a slice at a time: a refusal comes at the first slice past the bound, and a worker
# thread counting a large body lets the event loop in between slices.
_COUNTED_SLICE = 256 * 1024


def _count_containers(body: bytes) -> None:
    if len(body) < COUNTED_FROM_BYTES:
        return
    containers = 0
    for start in range(0, len(body), _COUNTED_SLICE):
        end = start + _COUNTED_SLICE
        containers += body.count(b"[", start, end) + body.count(b"{", start, end)
        if containers > MAX_CONTAINERS:
            raise invalid_request(f"The request body holds more than {MAX_CONTAINERS} JSON "
                                  "arrays and objects; at most that many are accepted")


def _parse_counted(body: bytes) -> Any:
    _count_containers(body)
    return orjson.loads(body)


async def parse_json(body: bytes) -> Any:
    """The value of a JSON body, counted first: inline under LARGE_JSON_BYTES, else in a
    worker thread.

    Raises ApiError: 400 for a body that is not JSON or holds too many containers."""
    try:
        if len(body) < LARGE_JSON_BYTES:
            _count_containers(body)
            return json.loads(body)
        return await asyncio.wrap_future(_parsers.submit(_parse_counted, body))
    except (ValueError, RecursionError) as exc:  # orjson's and json's decode errors
        raise validation_error_response([{"type": "json_invalid"}]) from exc
