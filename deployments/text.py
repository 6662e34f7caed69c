"""Text deployments, one per size class (text-xs, text-s, text-m, text-l): each replica holds
the engines of the catalog models assigned to its class and streams their chunks. Each engine's
sequences are shared among tenants by a fair-share gate (deployments/fair_share.py): least
served first, room kept for a newcomer, and a 503 with `Retry-After` instead of a long wait.

Serve options, and the environment of vLLM's CPU build: configs/deployments.yaml."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.base import ModelDeployment
from deployments.engines.openai_upstream import ENGINES as UPSTREAM_ENGINES
from deployments.engines.text import ENGINES, TextEngine
from deployments.fair_share import AtCapacity, FairShareGates, Turn
from deployments.protocol import (
    Chunk,
    TextEvent,
    TextRequest,
    at_capacity,
    not_served,
)
from deployments.spec import ModelSpec
from deployments.streaming import coalesce, merge
from deployments.tracing import RemoteTrace


@serve.deployment
class TextDeployment(ModelDeployment):
    # In process (vLLM), or a server the operator runs (`engine: openai`).
    ENGINES = {**ENGINES, **UPSTREAM_ENGINES}
    engines: dict[str, TextEngine]

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        self.gates = FairShareGates(models)
        for model_id, engine in self.engines.items():
            name_metrics = getattr(engine, "name_metrics", None)  # vLLM's: its stat logger
            if name_metrics is not None:
                name_metrics(model_id)

    async def generate(self, model_id: str, request: TextRequest
                       ) -> AsyncIterator[list[TextEvent] | TextEvent]:
        engine = self.engines.get(model_id)
        if engine is None:
            yield not_served(model_id)
            return
        trace = RemoteTrace.of(request.traceparent)
        arrived = time.time_ns()
        try:
            async with self.gates.of(model_id, engine).turn(
                    request.tenant, request.sampling.n) as turn:
                waited_ms: float | None = (time.time_ns() - arrived) / 1e6
                span = None
                if trace is not None:
                    trace.past_span("gate", arrived, model=model_id)
                    span = trace.span("engine", model=model_id)
                try:
                    # Lists of chunks: what a fast engine produced since the last list
                    # travels together.
                    async for chunks in coalesce(engine.generate(request)):
                        _count_served(turn, chunks)
                        if waited_ms is not None:
                            chunks, waited_ms = _with_gate_wait(chunks, waited_ms), None
                        yield chunks
                finally:
                    if span is not None:
                        span.end()
        except AtCapacity as full:
            if trace is not None:
                trace.past_span("gate", arrived, model=model_id, refused=True)
            yield at_capacity(model_id, full.retry_after)

    async def complete(self, model_id: str, request: TextRequest) -> list[TextEvent]:
        """The whole answer in one reply, for a unary request: one message back instead of a
        stream's pieces and its end, and no wait between pieces."""
        engine = self.engines.get(model_id)
        if engine is None:
            return [not_served(model_id)]
        trace = RemoteTrace.of(request.traceparent)
        arrived = time.time_ns()
        try:
            async with self.gates.of(model_id, engine).turn(
                    request.tenant, request.sampling.n) as turn:
                waited_ms = (time.time_ns() - arrived) / 1e6
                span = None
                if trace is not None:
                    trace.past_span("gate", arrived, model=model_id)
                    span = trace.span("engine", model=model_id)
                try:
                    # An engine with a unary call of its own (a server the operator runs:
                    # one JSON body instead of a stream to parse), else its stream, merged.
                    unary = getattr(engine, "complete", None)
                    events = (await unary(request) if unary is not None
                              else [event async for event in engine.generate(request)])
                    chunks = _with_gate_wait(events, waited_ms)
                finally:
                    if span is not None:
                        span.end()
                _count_served(turn, chunks)
        except AtCapacity as full:
            if trace is not None:
                trace.past_span("gate", arrived, model=model_id, refused=True)
            return [at_capacity(model_id, full.retry_after)]
        return merge(chunks)

    async def stats(self) -> dict[str, dict[str, Any]]:
        """Per model: requests in progress, tokens of requests cancelled mid-stream, and its
        fair-share gate (slots, running, waiting, active tenants, mean seconds a slot)."""
        return {model_id: {**engine.stats(),
                           "fair_share": self.gates.of(model_id, engine).stats()}
                for model_id, engine in self.engines.items()}

    def __del__(self) -> None:
        for engine in getattr(self, "engines", {}).values():
            with contextlib.suppress(Exception):  # shutting down: nothing left to tell
                engine.shutdown()


def _with_gate_wait(events: list[TextEvent], waited_ms: float) -> list[TextEvent]:
    """`events` with the gate's wait on their first chunk."""
    for i, event in enumerate(events):
        if isinstance(event, Chunk):
            return [*events[:i], dataclasses.replace(event, gate_wait_ms=round(waited_ms, 3)),
                    *events[i + 1:]]
    return events


def _count_served(turn: Turn, events: list[TextEvent] | TextEvent) -> None:
    """The tokens the engine computed for a request, as they come: the prompt's (those the
    prefix cache did not serve) with its first chunk, then each chunk's."""
    for event in events if isinstance(events, list) else (events,):
        if isinstance(event, Chunk):
            turn.served(event.tokens + (event.prompt_tokens or 0) - (event.cached_tokens or 0))
