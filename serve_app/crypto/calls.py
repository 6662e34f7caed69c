"""The body of a crypto RPC request and the node's answer to it: a JSON-RPC 2.0 call or batch
checked before anything is counted (400 naming each problem), and the credits of the calls
counted from the answer."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from serve_app.crypto.methods import ERROR_CREDITS, Refusal, classify
from serve_app.crypto.networks import Network
from serve_app.errors import ApiError, nest_errors

MAX_BATCH = 100
MAX_METHOD_CHARS = 128


# --- the request ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Call:
    """One JSON-RPC call of the request: its method, id (None: a notification, which has no
    `id` member; an `"id": null` is refused) and full credits."""

    method: str
    id: Any
    credits: int


@dataclass(frozen=True, slots=True)
class RpcRequest:
    payload: Any  # the parsed body, forwarded as checked
    calls: tuple[Call, ...]
    batch: bool

    @property
    def max_credits(self) -> int:
        return sum(call.credits for call in self.calls)


def bad_request(message: str, errors: Sequence[tuple[Sequence[str | int], str]]) -> ApiError:
    return ApiError(400, message, code="INVALID_REQUEST", details=nest_errors(errors))


def _item_problems(item: Any, path: tuple[int, ...]) -> list[tuple[tuple, str]]:
    if not isinstance(item, dict):
        return [(path, "Expected a JSON-RPC 2.0 request object")]
    problems: list[tuple[tuple, str]] = []
    method = item.get("method")
    if "method" not in item:
        problems.append(((*path, "method"), "Required"))
    elif not isinstance(method, str) or not method:
        problems.append(((*path, "method"), "Expected a method name (a non-empty string)"))
    elif len(method) > MAX_METHOD_CHARS:
        problems.append(((*path, "method"), f"At most {MAX_METHOD_CHARS} characters"))
    if "jsonrpc" in item and item["jsonrpc"] != "2.0":
        problems.append(((*path, "jsonrpc"), 'Expected "2.0"'))
    if "params" in item and not isinstance(item["params"], list | dict):
        problems.append(((*path, "params"), "Expected an array (or an object of named parameters)"))
    if "id" in item and item["id"] is None:
        # The node answers errors about unreadable calls with a null id too: an answer with
        # a null id could not be told from one to this call, nor priced as its own.
        problems.append(((*path, "id"), "A null id is not accepted: give the call an integer "
                                        "or a string id, or leave id out for a notification"))
    elif "id" in item and not (isinstance(item["id"], str)
                               or (isinstance(item["id"], int)
                                   and not isinstance(item["id"], bool))):
        problems.append(((*path, "id"), "Expected an integer or a string"))
    return problems


def _refuse_duplicate_ids(items: list[dict]) -> None:
    """400 when two calls of a batch share an id (same type and value: 1 and "1" differ):
    their answers could not be told apart, nor an error matched to its call. Notifications
    (no `id` member) are not counted."""
    seen: dict[tuple[str, Any], list[int]] = {}
    for i, item in enumerate(items):
        if "id" in item:
            seen.setdefault(_id_key(item["id"]), []).append(i)
    duplicates = {key: where for key, where in seen.items() if len(where) > 1}
    if not duplicates:
        return
    ids = ", ".join(json.dumps(value) for _, value in duplicates)
    what = "Duplicate id" if len(duplicates) == 1 else "Duplicate ids"
    raise bad_request(f"{what} in the batch: {ids}; each call needs its own id",
                       [((i, "id"), f"Duplicate id {json.dumps(key[1])}")
                        for key, where in duplicates.items() for i in where])


def parse_request(raw: bytes, network: Network) -> RpcRequest:
    """The checked request, or 400: empty body, malformed JSON, not a JSON-RPC object or batch,
    a batch empty or over 100, a malformed call, calls of a batch sharing an id, or methods not
    offered (all of them named)."""
    if not raw.strip():
        raise bad_request("Request body is empty: send a JSON-RPC 2.0 request object or a "
                           f"batch (array) of up to {MAX_BATCH}",
                           [((), "Request body is empty")])
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request("Malformed JSON in request body",
                           [((), "Request body is not valid JSON")]) from None
    batch = isinstance(payload, list)
    if batch:
        if not payload:
            raise bad_request("Empty batch: send 1 to 100 JSON-RPC requests",
                               [((), "Batch is empty")])
        if len(payload) > MAX_BATCH:
            message = (f"Batch of {len(payload)} requests exceeds the maximum of {MAX_BATCH}: "
                       "split it")
            raise bad_request(message, [((), message)])
        items = payload
    elif isinstance(payload, dict):
        items = [payload]
    else:
        raise bad_request("Expected a JSON-RPC 2.0 request object or a batch (array) of them",
                           [((), "Expected an object or an array")])
    problems = [p for i, item in enumerate(items)
                for p in _item_problems(item, (i,) if batch else ())]
    if problems:
        raise bad_request("Invalid JSON-RPC request", problems)
    if batch:
        _refuse_duplicate_ids(items)

    calls: list[Call] = []
    refused: list[tuple[tuple, Refusal]] = []
    for i, item in enumerate(items):
        checked = classify(item["method"], network.family, network.slug)
        if isinstance(checked, Refusal):
            refused.append((((i,) if batch else ()) + ("method",), checked))
        else:
            calls.append(Call(item["method"], item.get("id"), network.base_credits * checked))
    if refused:
        methods = list(dict.fromkeys(r.method for _, r in refused))
        what = "Unsupported method" if len(methods) == 1 else "Unsupported methods"
        scope = "; the whole batch is rejected" if batch else ""
        raise bad_request(f"{what} for {network.slug}: {', '.join(methods)}{scope}",
                           [(path, r.message) for path, r in refused])
    return RpcRequest(payload, tuple(calls), batch)


# --- the answer ---------------------------------------------------------------------------

def _is_answer(item: Any) -> bool:
    return isinstance(item, dict) and ("result" in item or "error" in item)


def _is_error(item: Any) -> bool:
    return isinstance(item, dict) and item.get("error") is not None


def _id_key(value: Any) -> tuple[str, Any]:
    return type(value).__name__, value  # 1 and "1" are different ids


def is_rpc_answer(answer: Any, request: RpcRequest) -> bool:
    """Whether the node's answer is JSON-RPC: an answer object for a single call; for a batch,
    an array of answer objects, or one error object (the node refused the whole batch)."""
    if not request.batch:
        return _is_answer(answer)
    if isinstance(answer, list):
        return all(_is_answer(item) for item in answer)
    return _is_error(answer)


def count_credits(request: RpcRequest, answer: Any) -> int:
    """Credits of the calls: each at its full tier, except a call the node answered with a
    JSON-RPC error (matched by id), billed ERROR_CREDITS. A call without an answer (a
    notification) is billed in full: the node did the work; an error with a null id (the
    node's answer to something it could not read) is never matched to one."""
    if not request.batch:
        return ERROR_CREDITS if _is_error(answer) else request.calls[0].credits
    if not isinstance(answer, list):  # one error for the whole batch
        return ERROR_CREDITS * len(request.calls)
    errors = Counter(_id_key(item.get("id")) for item in answer if _is_error(item))
    total = 0
    for call in request.calls:
        key = _id_key(call.id)
        if call.id is not None and errors[key] > 0:
            errors[key] -= 1
            total += ERROR_CREDITS
        else:
            total += call.credits
    return total


def error_credits(request: RpcRequest) -> int:
    """What a request the node failed on because of what it asked (an answer over the size
    cap, past the deadline) costs: the error rate for each call, never more than the call's
    full tier (within the hold)."""
    return sum(min(ERROR_CREDITS, call.credits) for call in request.calls)
