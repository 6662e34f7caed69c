"""Field types several requests share."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field


def _anon_user_id(value: str) -> str:
    if any(not (0x20 <= ord(ch) <= 0x7E) for ch in value):
        raise ValueError("must contain printable ASCII characters only (0x20 to 0x7E)")
    if "||" in value:
        raise ValueError("must not contain '||'")
    return value


AnonUserId = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_anon_user_id)]
