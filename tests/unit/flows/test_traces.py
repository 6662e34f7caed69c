"""One trace per request: the Gateway's steps and the model replica's work (the gate's wait,
the engine) in the same trace, joined across the call by the request's `traceparent`."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from deployments import tracing as replica_tracing
from serve_app import tracing as gateway_tracing
from tests.unit.flows.sse import DONE, events


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Both sides trace into one in-memory exporter (in process, as the unit tier runs them)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gateway_tracing.use_tracer_provider(provider)
    replica_tracing.use_tracer_provider(provider)
    yield exporter
    gateway_tracing.use_tracer_provider(None)
    replica_tracing.use_tracer_provider(None)
    provider.shutdown()


def _chat(gateway, key: str, **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": "Hi"}], **body})


def _trace_of(spans: InMemorySpanExporter, request_id: str):
    (root,) = [s for s in spans.get_finished_spans()
               if s.kind == SpanKind.SERVER and s.attributes["request.id"] == request_id]
    trace_id = root.context.trace_id
    return root, [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]


def test_a_streamed_chat_is_one_trace_with_spans_of_both_sides(fake_gateway, key, spans,
                                                               caplog):
    caplog.set_level(logging.INFO, logger="serve_app.access")
    resp = _chat(fake_gateway, key, stream=True)
    assert resp.status_code == 200
    assert events(resp.text)[-1] == DONE

    root, trace = _trace_of(spans, resp.headers["cf-ray"])
    # The access log's line names the trace: from a request id to its spans.
    (line,) = [json.loads(r.getMessage()) for r in caplog.records
               if r.name == "serve_app.access"]
    assert line["trace_id"] == format(root.context.trace_id, "032x")
    assert root.name == "POST /chat/completions"
    assert root.attributes["http.response.status_code"] == 200
    by_name = {s.name: s for s in trace}
    # The Gateway's steps, each a child of the request's span.
    for step in ("auth", "first-token", "settle"):
        assert by_name[step].parent.span_id == root.context.span_id, step
    assert {"limits", "hold"} <= by_name.keys() or "limits+hold" in by_name
    # The replica's work, under the step that called it, across the call.
    model_step = by_name["first-token"]
    for work in ("gate", "engine"):
        assert by_name[work].parent.span_id == model_step.context.span_id, work
        assert by_name[work].attributes["model"] == "chat-primary"
    assert by_name["gate"].end_time <= by_name["engine"].start_time
    # Every span of the trace ended, and no other request's span is in it.
    assert all(s.end_time is not None for s in trace)
    assert len({s.context.trace_id for s in spans.get_finished_spans()
                if s.kind == SpanKind.SERVER}) == len(
        [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER])


def test_a_unary_chat_traces_the_model_step_and_the_engine(fake_gateway, key, spans):
    resp = _chat(fake_gateway, key)
    assert resp.status_code == 200

    root, trace = _trace_of(spans, resp.headers["cf-ray"])
    by_name = {s.name: s for s in trace}
    assert by_name["engine"].parent.span_id == by_name["model"].context.span_id
    assert by_name["model"].parent.span_id == root.context.span_id


def test_without_an_exporter_nothing_is_traced(fake_gateway, key):
    assert gateway_tracing.tracer() is None and replica_tracing.tracer() is None
    resp = _chat(fake_gateway, key)
    assert resp.status_code == 200
