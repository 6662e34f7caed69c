"""One structured (JSON) line per request, written once its answer is out, streams included.

The line is built from what the request's context already holds (pipeline/context.py), after
the client has its answer: nothing is measured for it and nothing waits for it. It carries the
request id the client got (`CF-RAY`, `X-Request-ID`), so a client's report leads to its line,
and the trace id when the request was traced. It never holds a key or a secret: the account is
a hash of its id.

Records go to the `serve_app.access` logger. Where nothing else handles records (a Serve
replica, whose stderr Serve writes to the replica's log file; plain uvicorn) each line is written
to stderr bare, so that under Serve's JSON encoding the line is its record's `message`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from typing import Any

from starlette.types import Scope

from serve_app.pipeline.context import RequestContext

logger = logging.getLogger("serve_app.access")


def account_hash(account_id: str) -> str:
    """A stable pseudonym of an account for logs: 16 hex digits of its id's SHA-256."""
    return hashlib.sha256(account_id.encode()).hexdigest()[:16]


def client_address(scope: Scope) -> str:
    """The client's address: the one the caller gate found by the operator's trusted-proxy
    rule (kept in the request's state), else the socket's peer ("-" when there is none)."""
    address = scope.get("state", {}).get("client_address")
    if isinstance(address, str):
        return address
    return str((scope.get("client") or ("-",))[0])


def error_code(status: int, error_body: bytes) -> str | None:
    """The `code` of an error answer's JSON body (the spec's error shape), if it has one."""
    if status < 400 or not error_body:
        return None
    try:
        body = json.loads(error_body)
    except ValueError:  # cut at ERROR_BODY_BYTES, compressed, or not JSON
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def access_record(scope: Scope, ctx: RequestContext, status: int, error_body: bytes
                  ) -> dict[str, Any]:
    """The fields of one request's line."""
    caller = ctx.caller or ctx.authenticated_key
    model = ctx.limit_model or str(ctx.headers.get("x-service-model-id", ""))
    record: dict[str, Any] = {
        "ts": round(time.time(), 3),
        "request_id": ctx.request_id,
        "method": scope.get("method", ""),
        "route": ctx.route or scope.get("path", ""),
        "status": status,
        "error_code": error_code(status, error_body),
        "model": model or None,
        "account": account_hash(caller.account_id) if caller is not None else None,
        "tokens_in": ctx.tokens_in,
        "tokens_out": ctx.tokens_out,
        "cost_nanos_usd": ctx.charged_nanos,
        "duration_ms": round(ctx.times.elapsed_ms(), 2),
        "ttft_ms": None if ctx.first_token_ms is None else round(ctx.first_token_ms, 2),
        "gate_wait_ms": None if ctx.gate_wait_ms is None else round(ctx.gate_wait_ms, 2),
        "client": client_address(scope),
    }
    if ctx.trace is not None:
        record["trace_id"] = ctx.trace.trace_id
    return record


class _HandOver(logging.Handler):
    """Hands each record to the logger a Serve replica redirects its stderr to, as the
    redirect would, without the redirect's cost: it walks and reads the stack for every line
    it writes (a tenth of the Gateway's request path, measured under load)."""

    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.handle(record)


def write_access_lines_bare() -> None:
    """Each access line to stderr as it is, without the prefix of the platform's other
    records (called where nothing else handles records). In a Serve replica, whose stderr
    is a stream into Serve's logger, straight to that logger."""
    if logger.handlers:
        return
    serve_logger = getattr(sys.stderr, "_logger", None)  # Serve's StreamToLogger
    handler: logging.Handler
    if isinstance(serve_logger, logging.Logger):
        handler = _HandOver(serve_logger)
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


class AccessLog:
    """The ServiceHeadersMiddleware's `on_end`: writes the request's line."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def __call__(self, scope: Scope, ctx: RequestContext, status: int, error_body: bytes
                 ) -> None:
        if not self.enabled or not logger.isEnabledFor(logging.INFO):
            return
        record = access_record(scope, ctx, status, error_body)
        logger.info("%s", json.dumps(record, separators=(",", ":")))
