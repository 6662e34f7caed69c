"""API key secrets: how they are made, and the only form in which they are stored."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "sk-"


def generate_secret() -> str:
    """A new API key: 256 random bits, URL-safe, with a recognisable prefix."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """SHA-256 hex of the secret. The secret has 256 bits of entropy, so a fast unsalted hash
    is safe (as for GitHub or Stripe tokens) and lets one indexed query find the key."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()
