"""A model replica's part of a request's trace: the Gateway sends its span's W3C `traceparent`
with the request (deployments/protocol.py), and the replica's spans (the fair-share gate's wait,
the engine's work) join that trace.

Tracing is on when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set:
spans are then exported over OTLP/HTTP. When it is not, nothing is created: `RemoteTrace.of`
answers None and the request path costs one test.
"""

from __future__ import annotations

import os
import time
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
    _tracer = provider.get_tracer("deployments")


def use_tracer_provider(provider: Any) -> None:
    """Trace with `provider` (a test's, with an in-memory exporter); None: tracing off."""
    global _configured, _tracer
    _configured = True
    _tracer = provider.get_tracer("deployments") if provider is not None else None


def tracer() -> Any:
    if not _configured:
        _configure_from_environment()
    return _tracer


class RemoteTrace:
    """The trace a request belongs to, on the replica's side."""

    __slots__ = ("context", "tracer")

    def __init__(self, tracer: Any, context: Any) -> None:
        self.tracer = tracer
        self.context = context

    @classmethod
    def of(cls, traceparent: str | None) -> RemoteTrace | None:
        """None when tracing is off or the Gateway sent no trace."""
        if not traceparent:
            return None
        active = tracer()
        if active is None:
            return None
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        return cls(active, context)

    def span(self, name: str, **attributes: Any) -> Any:
        """A span started now; the caller ends it (`span.end()`), which may be in a later step
        of a stream."""
        return self.tracer.start_span(name, context=self.context, attributes=attributes)

    def past_span(self, name: str, started_ns: int, **attributes: Any) -> None:
        """A span from `started_ns` (time.time_ns()) to now: a wait measured as it ended."""
        span = self.tracer.start_span(name, context=self.context, attributes=attributes,
                                      start_time=started_ns)
        span.end(end_time=time.time_ns())
