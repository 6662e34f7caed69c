"""Errors a model deployment reports to the gateway: plain data, so they cross Ray intact and the
gateway turns them into the spec's error bodies."""

from __future__ import annotations

from typing import Any


def engine_error(status: int, message: str, *, code: str | None = None,
                 field: str | None = None) -> dict[str, Any]:
    return {"error": {"status": status, "message": message, "code": code, "field": field}}
