"""The exception handlers of the API: an `ApiError` as its body (errors.py), a validation error
as the spec's detailed error, Starlette's own HTTP errors in the spec's shape, and anything
unexpected as a 500 (or a 503 with Retry-After while the database is unreachable), logged once
with the request id and never shown to the client."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.db.engine import is_database_outage
from serve_app.errors import ApiError, retry_after, validation_error_response
from serve_app.http.render import error_response

logger = logging.getLogger("serve_app.errors")

_STATUS_MESSAGES = {
    404: "Not found",
    405: "Method not allowed",
    413: "Request body too large",
}


DATABASE_OUTAGE_RETRY_AFTER_S = 5


def log_unexpected_error(exc: BaseException, scope: Mapping[str, Any]) -> None:
    """Log once, with the request id, whichever layer meets the exception first."""
    if getattr(exc, "_serve_app_logged", False):
        return
    request_id = scope.get("state", {}).get("request_id", "-")
    logger.error("unhandled error in %s %s [request %s]", scope.get("method"),
                 scope.get("path"), request_id, exc_info=exc)
    exc._serve_app_logged = True  # type: ignore[attr-defined]


def unexpected_error(exc: BaseException, scope: Mapping[str, Any]) -> ApiError:
    """The error an exception no handler expected answers as: a 503 with Retry-After while the
    database is unreachable (the client may retry), else a 500. No stack trace or message of
    ours reaches the client; either is logged once."""
    if not is_database_outage(exc):
        log_unexpected_error(exc, scope)
        return ApiError(500, "An unknown error occurred", code="UNKNOWN_ERROR")
    if not getattr(exc, "_serve_app_logged", False):
        exc._serve_app_logged = True  # type: ignore[attr-defined]
        logger.warning("database unreachable in %s %s [request %s]: %s", scope.get("method"),
                       scope.get("path"), scope.get("state", {}).get("request_id", "-"),
                       type(exc.__cause__ or exc).__name__)
    return ApiError(503, "The service's database is unreachable; try again shortly",
                    code="SERVICE_UNAVAILABLE",
                    headers=retry_after(DATABASE_OUTAGE_RETRY_AFTER_S))


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
        return error_response(ApiError(exc.status_code, message,
                                       headers=getattr(exc, "headers", None)))

    async def on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(unexpected_error(exc, request.scope))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(Exception, on_unexpected_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ValidationError, on_pydantic_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
