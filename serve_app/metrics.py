"""Prometheus metrics through Ray's own metrics (`ray.util.metrics`): every Gateway replica on
every node reports to its node's Ray metrics agent, which serves them for Prometheus to scrape
at `--metrics-export-port` (`make run`: METRICS_PORT, 9464), aggregated by labels across
replicas and nodes. Ray exports application metrics with a `ray_` prefix:
`inference_requests_total` is scraped as `ray_inference_requests_total`.

Counters and gauges are kept in the process and handed to Ray by one flush a fraction of a
second later (deployments/metric_batch.py): a chat's records cost no call into Ray's core worker
each. Histograms record directly. Outside Ray (unit tests, plain uvicorn) the same calls record
nothing.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ray.util.metrics import Counter, Gauge, Histogram
from starlette.types import Scope

from deployments.metric_batch import BatchedCounter, BatchedGauge, MetricBatch, process_batch

# Seconds: from a cheap authenticated route to a long image edit or transcription.
LATENCY_BOUNDARIES = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                      10.0, 30.0, 60.0, 120.0, 300.0]


class Metrics:
    """The platform's metrics, created once per process (each replica's own instance);
    counters and gauges go through `batch`."""

    def __init__(self, batch: MetricBatch | None = None) -> None:
        batch = batch or process_batch()
        self.requests = BatchedCounter(Counter(
            "inference_requests_total", description="HTTP requests answered, by route "
            "template, status, model and kind of credentials (key, wallet, none).",
            tag_keys=("route", "status", "model", "auth")), batch)
        self.request_seconds = Histogram(
            "inference_request_seconds", description="Time to answer a request (to the end "
            "of a stream), by route template and model.",
            boundaries=LATENCY_BOUNDARIES, tag_keys=("route", "model"))
        self.tokens = BatchedCounter(Counter(
            "inference_tokens_total", description="Tokens charged, by model and direction "
            "(input, output, cache_read, cache_write).", tag_keys=("model", "direction")), batch)
        self.charged_usd = BatchedCounter(Counter(
            "inference_charged_usd_total", description="USD value charged (USD and DIEM "
            "together), by model.", tag_keys=("model",)), batch)
        self.limiter = BatchedCounter(Counter(
            "inference_limiter_decisions_total", description="Rate-limit decisions, by "
            "outcome (admitted, refused_rpm, refused_tpm, refused_budget).",
            tag_keys=("outcome",)), batch)
        self.limiter_fallbacks = BatchedCounter(Counter(
            "inference_limiter_fallbacks_total", description="Times a replica counted limits "
            "itself because the shared limiter (Redis or the Ray actor) was out of reach.",
            tag_keys=("backend",)), batch)
        self.billing_seconds = Histogram(
            "inference_billing_seconds", description="Time of a ledger operation as the "
            "request waits for it (hold, settle, release).",
            boundaries=LATENCY_BOUNDARIES, tag_keys=("operation",))
        self.engine_seconds = Histogram(
            "inference_engine_seconds", description="Time a model replica spent on a call, "
            "by deployment and model.", boundaries=LATENCY_BOUNDARIES,
            tag_keys=("deployment", "model"))
        self.in_flight = BatchedGauge(Gauge(
            "inference_deployment_in_flight", description="Calls this replica has waiting on "
            "a model deployment (queued or running there), by deployment.",
            tag_keys=("deployment",)), batch)
        self.dependency_up = BatchedGauge(Gauge(
            "inference_dependency_up", description="1 when the last readiness check (GET "
            "/ready) found the part working, 0 when not: database, redis, model:<id>.",
            tag_keys=("part",)), batch)
        self._in_flight: dict[str, int] = {}

    def call_started(self, deployment: str) -> None:
        count = self._in_flight[deployment] = self._in_flight.get(deployment, 0) + 1
        self.in_flight.set(count, tags={"deployment": deployment})

    def call_ended(self, deployment: str) -> None:
        count = self._in_flight[deployment] = max(0, self._in_flight.get(deployment, 1) - 1)
        self.in_flight.set(count, tags={"deployment": deployment})

    def calls_in_flight(self, deployment: str) -> int:
        return self._in_flight.get(deployment, 0)


@cache
def metrics() -> Metrics:
    return Metrics()


def flush_metrics() -> None:
    """Hand Ray the counts and gauge values this process kept since the last flush (at a
    replica's shutdown: Serve may end its worker before the exit handlers run)."""
    process_batch().flush()


def route_of(scope: dict[str, Any]) -> str:
    """The route template (`/api_keys/{id}`), never the raw path: bounded label values."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


def record_request(scope: Scope, status: int, seconds: float, *, model: str, auth: str
                   ) -> None:
    """Count and time one HTTP request of the API: route template, status, model, kind of
    credentials (`none`, `key`, `wallet`); the time runs to the end of the answer, streams
    included."""
    route = route_of(scope)
    m = metrics()
    m.requests.inc(tags={"route": route, "status": str(status), "model": model, "auth": auth})
    m.request_seconds.observe(seconds, tags={"route": route, "model": model})
