"""Error bodies of the spec and the exception handlers that produce them.

Every error leaves the gateway as a standard error `{error[, code]}` or a detailed error
`{error, details}` whose `details` nest field names to `{_errors: [...]}`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.db.engine import is_database_outage

logger = logging.getLogger("serve_app.errors")


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
        if self.raw_body is not None:  # a published body without `error` (x402 requirements)
            return self.raw_body
        body: dict[str, Any] = {"error": self.message}
        if self.code:
            body["code"] = self.code
        if self.details is not None:
            body["details"] = self.details
        body.update(self.extra)
        return body

    @property
    def blames_caller(self) -> bool:
        """Whether the failure counts toward the caller's error budget: a model at capacity
        (503 `MODEL_AT_CAPACITY`) is the platform's state, not the caller's failure."""
        return not (self.status == 503 and self.code == "MODEL_AT_CAPACITY")


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


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


_STATUS_MESSAGES = {
    404: "Not found",
    405: "Method not allowed",
    413: "Request body too large",
}


UNKNOWN_ERROR_BODY = {"error": "An unknown error occurred", "code": "UNKNOWN_ERROR"}
DATABASE_OUTAGE_BODY = {"error": "The service's database is unreachable; try again shortly",
                        "code": "SERVICE_UNAVAILABLE"}
DATABASE_OUTAGE_RETRY_AFTER_S = "5"


def log_unexpected_error(exc: BaseException, scope: Mapping[str, Any]) -> None:
    """Log once, with the request id, whichever layer meets the exception first."""
    if getattr(exc, "_serve_app_logged", False):
        return
    request_id = scope.get("state", {}).get("request_id", "-")
    logger.error("unhandled error in %s %s [request %s]", scope.get("method"),
                 scope.get("path"), request_id, exc_info=exc)
    exc._serve_app_logged = True  # type: ignore[attr-defined]


def unexpected_error_body(exc: BaseException, scope: Mapping[str, Any]
                          ) -> tuple[int, dict[str, str], dict[str, str]]:
    """Status, body and headers for an exception no handler expected: a 503 with Retry-After
    while the database is unreachable (the client may retry), else a 500. No stack trace or
    message of ours reaches the client; either is logged once."""
    if not is_database_outage(exc):
        log_unexpected_error(exc, scope)
        return 500, UNKNOWN_ERROR_BODY, {}
    if not getattr(exc, "_serve_app_logged", False):
        exc._serve_app_logged = True  # type: ignore[attr-defined]
        logger.warning("database unreachable in %s %s [request %s]: %s", scope.get("method"),
                       scope.get("path"), scope.get("state", {}).get("request_id", "-"),
                       type(exc.__cause__ or exc).__name__)
    return 503, DATABASE_OUTAGE_BODY, {"Retry-After": DATABASE_OUTAGE_RETRY_AFTER_S}


def unexpected_error_response(exc: BaseException, scope: Mapping[str, Any]) -> JSONResponse:
    status, body, headers = unexpected_error_body(exc, scope)
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        if not exc.blames_caller:
            context = request.scope.get("state", {}).get("context")
            if context is not None:  # read when the request's outcome is counted
                context.caller_failure = False
        return error_response(exc)

    async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error_response(exc.errors()))

    async def on_pydantic_error(_: Request, exc: ValidationError) -> JSONResponse:
        return error_response(validation_error_response(exc.errors()))

    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = _STATUS_MESSAGES.get(exc.status_code) or str(exc.detail)
        return JSONResponse({"error": message}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_error_response(exc, request.scope)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(Exception, on_unexpected_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ValidationError, on_pydantic_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
