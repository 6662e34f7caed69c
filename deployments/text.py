"""Text deployments, one per size class (text-xs, text-s, text-m, text-l): each replica holds
the engines of the catalog models assigned to its class and streams their chunks.

Serve options, and the environment of vLLM's CPU build: configs/deployments.yaml."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.base import ModelDeployment
from deployments.engines.text import ENGINES, TextEngine
from deployments.protocol import TextEvent, TextRequest, not_served
from deployments.streaming import coalesce, merge


@serve.deployment
class TextDeployment(ModelDeployment):
    ENGINES = ENGINES
    engines: dict[str, TextEngine]

    async def generate(self, model_id: str, request: TextRequest
                       ) -> AsyncIterator[list[TextEvent] | TextEvent]:
        engine = self.engines.get(model_id)
        if engine is None:
            yield not_served(model_id)
            return
        # Lists of chunks: what a fast engine produced since the last list travels together.
        async for chunks in coalesce(engine.generate(request)):
            yield chunks

    async def complete(self, model_id: str, request: TextRequest) -> list[TextEvent]:
        """The whole answer in one reply, for a unary request: one message back instead of a
        stream's pieces and its end, and no wait between pieces."""
        engine = self.engines.get(model_id)
        if engine is None:
            return [not_served(model_id)]
        return merge([chunk async for chunk in engine.generate(request)])

    async def stats(self) -> dict[str, dict[str, Any]]:
        """Per model: requests in progress, and tokens of requests cancelled mid-stream."""
        return {model_id: engine.stats() for model_id, engine in self.engines.items()}

    def __del__(self) -> None:
        for engine in getattr(self, "engines", {}).values():
            with contextlib.suppress(Exception):  # shutting down: nothing left to tell
                engine.shutdown()
