"""Error bodies of the spec: `ApiError`, the builders of each error the Gateway answers, and
the one pair that turns an `ApiError` into a body: `error_body` for a JSON answer,
`stream_error_body` for a stream that has started. The handlers that turn exceptions into
answers are in serve_app/error_handlers.py; serve_app/http/render.py renders the bodies.

Every error answered as JSON leaves the gateway as a standard error `{error[, code]}` or a
detailed error `{error, details}` whose `details` nest field names to `{_errors: [...]}`. A
stream that has started reports its error in the stream's own convention (neither the spec nor
the reference shows one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

# The in-stream error of each stream: chat.completion.chunk events, /responses' response.*.
StreamDialect = Literal["chat", "responses"]


def retry_after_s(seconds: float) -> int:
    """The one rule of `Retry-After` (every answer that tells a client when to come back: a
    rate limit's reset, a model at capacity, a busy file reader, an unreachable database):
    whole seconds, rounded up, at least 1 (0 would send a client straight back into the same
    refusal)."""
    return max(1, math.ceil(seconds))


def retry_after(seconds: float) -> dict[str, str]:
    """The `Retry-After` header of an answer whose client may retry in `seconds`."""
    return {"Retry-After": str(retry_after_s(seconds))}


class ApiError(Exception):
    """An error the client sees: status, message and optional code, details, headers (or a
    whole `raw_body`, for the few published error bodies that are not `{error, ...}`)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        details: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        raw_body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.raw_body = dict(raw_body) if raw_body is not None else None
        self.status = status
        self.message = message
        self.code = code
        self.details = details
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return error_body(self)

    @property
    def blames_caller(self) -> bool:
        """Whether the failure counts toward the caller's error budget: a model at capacity
        (503 `MODEL_AT_CAPACITY`) is the platform's state, not the caller's failure."""
        return not (self.status == 503 and self.code == "MODEL_AT_CAPACITY")


def error_body(err: ApiError) -> dict[str, Any]:
    """The body of a JSON error answer: the standard or detailed error (or a published body of
    its own, `raw_body`)."""
    if err.raw_body is not None:  # a published body without `error` (x402 requirements)
        return err.raw_body
    body: dict[str, Any] = {"error": err.message}
    if err.code:
        body["code"] = err.code
    if err.details is not None:
        body["details"] = err.details
    body.update(err.extra)
    return body


def stream_error_body(err: ApiError, dialect: StreamDialect) -> dict[str, Any]:
    """The error as a stream that has started reports it, in the stream's dialect, as the SDKs
    of that convention read it: chat's event is `{error: {message, type, code}}` (the `openai`
    SDKs raise it with its message, Vercel's `ai` as an error part; a string `error` they
    would misread), with the code also beside it; /responses' is the Responses API's
    `{code, message}`, the `error` of its `response.failed`."""
    if dialect == "responses":
        return {"code": err.code, "message": err.message}
    kind = ("server_error" if err.status >= 500 else
            "rate_limit_error" if err.status == 429 else "invalid_request_error")
    return {"error": {"message": err.message, "type": kind, "code": err.code}, "code": err.code}


def refused_for_capacity(failure: BaseException) -> bool:
    """Whether a request failed because its model was at capacity: it never reached the
    engine, so none of its tokens count toward the per-minute limit."""
    return isinstance(failure, ApiError) and not failure.blames_caller


class UnsupportedFeature(ApiError):
    """A request for something the model cannot do (counted by its own error budget)."""

    def __init__(self, message: str, field_name: str | None = None) -> None:
        super().__init__(400, message, code="INVALID_MODEL",
                         details=nest_errors([((field_name,) if field_name else (), message)]))


def authentication_failed(message: str = "Authentication failed") -> ApiError:
    return ApiError(401, message, code="AUTHENTICATION_FAILED")


def admin_key_required() -> ApiError:
    return ApiError(401, "Admin API key required", code="AUTHENTICATION_FAILED")


def payload_too_large(message: str) -> ApiError:
    """413 with the spec's payload-too-large body (`{code, error}`)."""
    return ApiError(413, message, code="PAYLOAD_TOO_LARGE",
                    raw_body={"code": "PAYLOAD_TOO_LARGE", "error": message})


def invalid_request(message: str, field: str | None = None) -> ApiError:
    """A 400 detailed error about one field (or the whole request when `field` is None)."""
    path = (field,) if field else ()
    return ApiError(400, message, code="INVALID_REQUEST", details=nest_errors([(path, message)]))


def nest_errors(errors: Iterable[tuple[Sequence[str | int], str]]) -> dict[str, Any]:
    """Build `{_errors: [...], field: {_errors: [...], sub: {...}}}` from (path, message) pairs."""
    root: dict[str, Any] = {"_errors": []}
    for path, message in errors:
        node = root
        for part in path:
            node = node.setdefault(str(part), {"_errors": []})
        node["_errors"].append(message)
    return root


def _pydantic_message(err: Mapping[str, Any]) -> str:
    if err.get("type") == "missing":
        return "Required"
    if err.get("type") == "extra_forbidden":
        return "Unrecognized key"
    return str(err.get("msg", "Invalid value"))


def validation_error_response(errors: Sequence[Mapping[str, Any]]) -> ApiError:
    if any(e.get("type") == "json_invalid" for e in errors):
        return ApiError(
            400,
            "Malformed JSON in request body",
            code="INVALID_REQUEST",
            details=nest_errors([((), "Request body is not valid JSON")]),
        )
    pairs = []
    for err in errors:
        loc = list(err.get("loc", ()))
        # FastAPI prefixes the location with where the value came from.
        if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
            loc = loc[1:]
        pairs.append((loc, _pydantic_message(err)))
    return ApiError(400, "Invalid request parameters", code="INVALID_REQUEST",
                    details=nest_errors(pairs))

