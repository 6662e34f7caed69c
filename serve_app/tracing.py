"""One OpenTelemetry trace per request: the Gateway's root span, a span for each step of the
request (the steps Server-Timing times: auth, limits, hold, the model call, settle...), and the
model replica's spans joined through the `traceparent` the model call carries across Ray
(deployments/protocol.py, deployments/tracing.py).

Tracing is on when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is
set: spans are exported over OTLP/HTTP (`OTEL_SERVICE_NAME` names the service, by default
`inference-platform`). When it is not set, nothing is created: a request has no trace, and each
step costs one test of `None`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_tracer: Any = None
_configured = False


def _configure_from_environment() -> None:
    global _configured, _tracer
    _configured = True
    if not any(os.environ.get(name) for name in ENDPOINT_VARIABLES):
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", "inference-platform")}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _tracer = provider.get_tracer("serve_app")


def use_tracer_provider(provider: Any) -> None:
    """Trace with `provider` (a test's, with an in-memory exporter); None: tracing off."""
    global _configured, _tracer
    _configured = True
    _tracer = provider.get_tracer("serve_app") if provider is not None else None


def tracer() -> Any:
    if not _configured:
        _configure_from_environment()
    return _tracer


class RequestTrace:
    """A request's root span and its steps' spans, each a child of the root."""

    __slots__ = ("context", "method", "root", "trace_id", "tracer")

    def __init__(self, tracer: Any, method: str, path: str, request_id: str) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        self.tracer = tracer
        self.method = method
        self.root = tracer.start_span(f"{method} {path}", kind=SpanKind.SERVER, attributes={
            "http.request.method": method, "url.path": path, "request.id": request_id})
        self.context = set_span_in_context(self.root)
        self.trace_id = format(self.root.get_span_context().trace_id, "032x")

    @classmethod
    def start(cls, method: str, path: str, request_id: str) -> RequestTrace | None:
        """The request's trace, or None when tracing is off."""
        active = tracer()
        return None if active is None else cls(active, method, path, request_id)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A step's span, current while it runs: a model call made in it carries it
        (`traceparent`)."""
        with self.tracer.start_as_current_span(name, context=self.context):
            yield

    def past_step(self, name: str, ms: float) -> None:
        """A step measured elsewhere, ending now (a replica's own time)."""
        end = time.time_ns()
        span = self.tracer.start_span(name, context=self.context,
                                      start_time=end - int(ms * 1_000_000))
        span.end(end_time=end)

    def end(self, status: int, route: str) -> None:
        """The root span ends with the answer: named by the route's template once known."""
        from opentelemetry.trace import Status, StatusCode

        if route:
            self.root.update_name(f"{self.method} {route}")
            self.root.set_attribute("http.route", route)
        self.root.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.root.set_status(Status(StatusCode.ERROR))
        self.root.end()


def traceparent() -> str | None:
    """The W3C `traceparent` of the current span (a step's), for a call across Ray; None when
    there is none."""
    if tracer() is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")
