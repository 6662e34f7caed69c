"""A request router for text deployments: requests that carry the same `prompt_cache_key`
prefer the same replica (whose prefix cache holds their conversation); the rest, and keyed
requests whose preferred replica is full, go by Serve's power-of-two-choices."""

from __future__ import annotations

import hashlib
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter

from deployments.protocol import TextRequest


def _cache_key(pending_request: Any) -> str | None:
    """The `prompt_cache_key` of a text call, `generate(model_id, request)` or
    `complete(model_id, request)`; None for any other call (stats)."""
    if pending_request is None:
        return None
    args = pending_request.args
    request = args[1] if len(args) > 1 else pending_request.kwargs.get("request")
    return request.prompt_cache_key if isinstance(request, TextRequest) else None


def _score(key: str, replica_id: str) -> bytes:
    return hashlib.blake2b(f"{key}|{replica_id}".encode(), digest_size=8).digest()


class CacheKeyAffinityRouter(PowerOfTwoChoicesRequestRouter):
    async def choose_replicas(self, candidate_replicas, pending_request=None):
        key = _cache_key(pending_request)
        if key and candidate_replicas:
            # Rendezvous hashing: the same key ranks replicas the same way on every router,
            # and only the keys of a replica that goes away move.
            ranked = sorted(candidate_replicas,
                            key=lambda r: _score(key, r.replica_id.unique_id), reverse=True)
            available = self.select_available_replicas(ranked[:1])
            if available:
                return [available]
        return await super().choose_replicas(candidate_replicas, pending_request)
