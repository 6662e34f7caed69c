"""Short-lived delivery URLs of finished media (`download_url` of the video queue result): the
queue id and an expiry, signed with a server secret every replica shares, so the link works
without an API key until it expires and cannot be made for another job or a later time."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from urllib.parse import urlencode

VALID_FOR_S = 24 * 3600
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _signature(secret: str, queue_id: str, expires: int) -> str:
    message = f"{queue_id}.{expires}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def download_url(base_url: str, secret: str, queue_id: str, *, now: float | None = None) -> str:
    expires = int(now if now is not None else time.time()) + VALID_FOR_S
    query = urlencode({"expires": expires, "signature": _signature(secret, queue_id, expires)})
    return f"{base_url}/video/download/{queue_id}?{query}"


def is_valid(secret: str, queue_id: str, expires: int, signature: str, *,
             now: float | None = None) -> bool:
    if expires < (now if now is not None else time.time()) or not _HEX64.fullmatch(signature):
        return False
    return hmac.compare_digest(_signature(secret, queue_id, expires), signature)
