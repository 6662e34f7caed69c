"""Metrics of the model replicas, through Ray's metrics (`ray.util.metrics`): every replica on
every node reports to its node's metrics agent, the same Prometheus endpoint as the Gateway's
(serve_app/metrics.py; Ray prefixes them with `ray_`). Counters and gauges are kept in the
process and handed to Ray by one flush a fraction of a second later (deployments/metric_batch.py:
a gate's turn or an engine step costs no call into Ray's core worker each); histograms record
directly. Outside Ray the calls record nothing.

Two families: the fair-share gate in front of each engine (deployments/fair_share.py: waiting
requests and their wait per model and tier, refusals for capacity, engine seconds), and the
text engine's own figures as vLLM measures them (deployments/engines/vllm_stats.py).
"""

from __future__ import annotations

from functools import cache

from ray.util.metrics import Counter, Gauge, Histogram

from deployments.metric_batch import BatchedCounter, BatchedGauge, MetricBatch, process_batch

# Seconds a request waits at a gate, or its time to first token: from an idle engine to one
# refusing past MAX_QUEUE_WAIT_S.
WAIT_BOUNDARIES = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
                   60.0, 120.0]
# Seconds per output token: 1 ms (a GPU) to a second (a big model on a busy CPU).
TOKEN_BOUNDARIES = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
                    1.0]
# Seconds of a whole generation or of an engine call (an image, a clip of speech).
ENGINE_BOUNDARIES = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                     120.0, 300.0, 600.0]


class GateMetrics:
    """The fair-share gates' figures (one instance per process); counters and gauges go
    through `batch`."""

    def __init__(self, batch: MetricBatch | None = None) -> None:
        batch = batch or process_batch()
        self.waiting = BatchedGauge(Gauge(
            "inference_gate_waiting", description="Requests waiting for their turn at a "
            "model's fair-share gate, by model and rate-limit tier.",
            tag_keys=("model", "tier")), batch)
        self.running = BatchedGauge(Gauge(
            "inference_gate_running", description="Requests holding a slot of a model's "
            "engine, by model.", tag_keys=("model",)), batch)
        self.wait_seconds = Histogram(
            "inference_gate_wait_seconds", description="Time a request waited at the gate "
            "for its turn, by model and tier.", boundaries=WAIT_BOUNDARIES,
            tag_keys=("model", "tier"))
        self.refused = BatchedCounter(Counter(
            "inference_gate_refused_total", description="Requests refused at the gate with "
            "503 MODEL_AT_CAPACITY (the wait would pass MAX_QUEUE_WAIT_S), by model.",
            tag_keys=("model",)), batch)
        self.engine_seconds = Histogram(
            "inference_gate_engine_seconds", description="Time a request held its engine slot "
            "(a media engine's work on it), by model.", boundaries=ENGINE_BOUNDARIES,
            tag_keys=("model",))


class EngineMetrics:
    """A text engine's figures as vLLM measures them (one instance per process); counters
    and gauges go through `batch`."""

    def __init__(self, batch: MetricBatch | None = None) -> None:
        batch = batch or process_batch()
        self.ttft = Histogram(
            "inference_engine_ttft_seconds", description="Time to first token, from the "
            "request's arrival at the engine, by model.", boundaries=WAIT_BOUNDARIES,
            tag_keys=("model",))
        self.tpot = Histogram(
            "inference_engine_tpot_seconds", description="Time per output token after the "
            "first, a finished request's mean, by model.", boundaries=TOKEN_BOUNDARIES,
            tag_keys=("model",))
        self.e2e = Histogram(
            "inference_engine_e2e_seconds", description="A finished request's time in the "
            "engine, arrival to last token, by model.", boundaries=ENGINE_BOUNDARIES,
            tag_keys=("model",))
        self.queue = Histogram(
            "inference_engine_queue_seconds", description="A finished request's time waiting "
            "in the engine's scheduler before its first step, by model.",
            boundaries=WAIT_BOUNDARIES, tag_keys=("model",))
        self.prompt_tokens = BatchedCounter(Counter(
            "inference_engine_prompt_tokens_total", description="Prompt tokens the engine "
            "prefilled (prefix-cache hits included), by model.", tag_keys=("model",)), batch)
        self.generation_tokens = BatchedCounter(Counter(
            "inference_engine_generation_tokens_total", description="Tokens the engine "
            "generated, by model.", tag_keys=("model",)), batch)
        self.running = BatchedGauge(Gauge(
            "inference_engine_requests_running", description="Requests in the engine's "
            "running batch, by model.", tag_keys=("model",)), batch)
        self.waiting = BatchedGauge(Gauge(
            "inference_engine_requests_waiting", description="Requests in the engine's own "
            "queue (admitted by the gate, not yet scheduled), by model.",
            tag_keys=("model",)), batch)
        self.kv_cache_usage = BatchedGauge(Gauge(
            "inference_engine_kv_cache_usage", description="Fraction of the KV cache's blocks "
            "in use (0 to 1), by model.", tag_keys=("model",)), batch)
        self.prefix_cache_queries = BatchedCounter(Counter(
            "inference_engine_prefix_cache_queries_total", description="Prompt tokens looked "
            "up in the prefix cache, by model.", tag_keys=("model",)), batch)
        self.prefix_cache_hits = BatchedCounter(Counter(
            "inference_engine_prefix_cache_hits_total", description="Prompt tokens the prefix "
            "cache served, by model (hit rate: hits over queries).", tag_keys=("model",)), batch)
        self.preemptions = BatchedCounter(Counter(
            "inference_engine_preemptions_total", description="Running requests the engine "
            "preempted (KV cache full), by model.", tag_keys=("model",)), batch)


@cache
def gate_metrics() -> GateMetrics:
    return GateMetrics()


@cache
def engine_metrics() -> EngineMetrics:
    return EngineMetrics()
